#include <chrono>
#include <cmath>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <tuple>

#include <fmt/format.h>

#include <meshtensor/checkpoint/checkpoint.hpp>
#include <meshtensor/comm/agree.hpp>
#include <meshtensor/comm/mesh_groups.hpp>
#include <meshtensor/core/error.hpp>
#include <meshtensor/fsdp/reduction.hpp>
#include <meshtensor/fsdp/sharded_model.hpp>
#include <meshtensor/kernels/binned_sum.hpp>
#include <meshtensor/mesh/layout.hpp>
#include <meshtensor/nn/loss.hpp>
#include <meshtensor/train/model_state.hpp>
#include <meshtensor/train/trainer.hpp>

namespace meshtensor::train {

Strategy parse_strategy(const std::string& text) {
  if (text == "ddp") return Strategy::ddp;
  if (text == "fsdp") return Strategy::fsdp;
  if (text == "hsdp") return Strategy::hsdp;
  throw ParseError(fmt::format("unknown strategy '{}' (expected ddp, fsdp or hsdp)", text));
}

MicroBatchMode parse_micro_batch_mode(const std::string& text) {
  if (text == "no-sync") return MicroBatchMode::no_sync;
  if (text == "reduce-scatter") return MicroBatchMode::reduce_scatter;
  throw ParseError(
      fmt::format("unknown micro-batch mode '{}' (expected no-sync or reduce-scatter)", text));
}

OptimizerKind parse_optimizer(const std::string& text) {
  if (text == "adamw") return OptimizerKind::adamw;
  if (text == "sgd") return OptimizerKind::sgd;
  throw ParseError(fmt::format("unknown optimizer '{}' (expected adamw or sgd)", text));
}

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

/// Rows `order[first .. first + count)` of `set` as f32 inputs in [0, 1] and their labels.
Tensor gather_inputs(const ImageSet& set, const std::vector<std::int64_t>* order,
                     std::int64_t first, std::int64_t count, std::vector<std::uint8_t>& labels) {
  const std::int64_t features = set.features();
  Tensor x(Shape{count, features}, DType::f32);
  auto values = x.values<float>();
  labels.resize(static_cast<std::size_t>(count));
  for (std::int64_t r = 0; r < count; ++r) {
    const std::int64_t sample =
        order != nullptr ? (*order)[static_cast<std::size_t>(first + r)] : first + r;
    const std::uint8_t* pixels = set.pixels.data() + sample * features;
    for (std::int64_t f = 0; f < features; ++f)
      values[static_cast<std::size_t>(r * features + f)] = static_cast<float>(pixels[f]) / 255.0f;
    labels[static_cast<std::size_t>(r)] = set.labels[static_cast<std::size_t>(sample)];
  }
  return x;
}

/// epoch_order(), computed once for all the ranks of this process that ask for it while one
/// holds it: thread ranks would otherwise each keep a copy of the whole permutation.
std::shared_ptr<const std::vector<std::int64_t>> shared_epoch_order(std::int64_t count,
                                                                    std::uint64_t seed,
                                                                    std::int64_t epoch) {
  using Key = std::tuple<std::int64_t, std::uint64_t, std::int64_t>;
  static std::mutex mutex;
  static std::map<Key, std::weak_ptr<const std::vector<std::int64_t>>> orders;
  const std::lock_guard lock(mutex);
  std::erase_if(orders, [](const auto& entry) { return entry.second.expired(); });
  auto& slot = orders[Key{count, seed, epoch}];
  if (auto held = slot.lock()) return held;
  auto made = std::make_shared<const std::vector<std::int64_t>>(epoch_order(count, seed, epoch));
  slot = made;
  return made;
}

comm::CollectiveOptions reduce_options(ReduceOp op, comm::ReductionMode mode) {
  comm::CollectiveOptions options;
  options.op = op;
  options.mode = mode;
  return options;
}

/// The mesh of a strategy and the mesh dims parameters are sharded / replicated over.
struct Placement {
  DeviceMesh mesh;
  fsdp::FsdpConfig config;
  std::string description;
};

Placement placement_for(const TrainConfig& config, std::int64_t ranks) {
  fsdp::FsdpConfig shard;
  shard.reshard_after_forward = config.reshard_after_forward;
  shard.param_dtype = config.param_dtype;
  shard.reduce_dtype = config.reduce_dtype;
  switch (config.strategy) {
    case Strategy::ddp:
      shard.replicate_mesh_dims = {0};
      shard.shard_mesh_dims = {};
      return {DeviceMesh({ranks}), shard, fmt::format("{} (replicate)", ranks)};
    case Strategy::fsdp:
      shard.shard_mesh_dims = {0};
      return {DeviceMesh({ranks}), shard, fmt::format("{} (shard)", ranks)};
    case Strategy::hsdp: {
      const std::int64_t replicas = config.replicas > 0 ? config.replicas : (ranks > 1 ? 2 : 1);
      if (ranks % replicas != 0) {
        throw InvalidArgument(fmt::format(
            "hsdp: {} ranks do not split into {} replicas of equal shard groups", ranks, replicas));
      }
      shard.replicate_mesh_dims = {0};
      shard.shard_mesh_dims = {1};
      return {DeviceMesh({replicas, ranks / replicas}), shard,
              fmt::format("{}x{} (replicate x shard)", replicas, ranks / replicas)};
    }
  }
  throw InvalidArgument("unknown strategy");
}

/// The model's architecture as checkpoint metadata: a resume refuses a checkpoint of another one
/// (the tensor shapes alone do not tell activations apart).
std::string architecture_text(const nn::MlpConfig& model) {
  return fmt::format("mlp hidden={} activation={} layernorm={}", fmt::join(model.hidden, ","),
                     model.activation == nn::Activation::gelu ? "gelu" : "relu",
                     model.layernorm ? "yes" : "no");
}

}  // namespace

void validate_config(const TrainConfig& config, const Dataset& data) {
  const auto positive = [](std::int64_t value, const char* what) {
    if (value < 1) throw InvalidArgument(fmt::format("{} must be at least 1, got {}", what, value));
  };
  positive(config.batch, "the batch");
  positive(config.micro_batches, "the number of micro-batches");
  if (config.save_every < 0 || config.stop_after < 0 || config.stop_after_epochs < 0 ||
      config.keep_checkpoints < 0) {
    throw InvalidArgument(fmt::format(
        "save_every {}, stop_after {}, stop_after_epochs {} and keep_checkpoints {} must be >= 0",
        config.save_every, config.stop_after, config.stop_after_epochs, config.keep_checkpoints));
  }
  if (config.steps < 0) throw InvalidArgument(fmt::format("steps {} is negative", config.steps));
  positive(config.epochs, "the number of epochs");  // also when steps decide the length
  // The command line's ranges, for every caller (the Python module included).
  const auto within = [](double value, double low, double high, const char* what) {
    if (!(value >= low && value <= high)) {
      throw InvalidArgument(
          fmt::format("{} must be within [{}, {}], got {}", what, low, high, value));
    }
  };
  within(config.schedule.base, 0.0, 1e6, "the learning rate");
  within(config.weight_decay, 0.0, 1e6, "the weight decay");
  within(config.momentum, 0.0, 1.0, "the momentum");
  if (config.schedule.warmup_steps < 0) {
    throw InvalidArgument(
        fmt::format("the warmup must be at least 0 steps, got {}", config.schedule.warmup_steps));
  }
  if (config.replicas < 0) {
    throw InvalidArgument(
        fmt::format("replicas must be at least 1 (0: the default), got {}", config.replicas));
  }
  if (config.prefetch < 0 || config.prefetch > 64)
    throw InvalidArgument(fmt::format("prefetch must be within [0, 64], got {}", config.prefetch));
  if (config.mode == comm::ReductionMode::exact && config.batch > kernels::kMaxBinnedAddends) {
    throw InvalidArgument(fmt::format("a batch of {} is above the {} samples exact mode sums",
                                      config.batch, kernels::kMaxBinnedAddends));
  }
  if (data.train.count == 0) throw InvalidArgument("the training set is empty");
  // Micro-batches split each rank's slice of the global batch (some may be empty); more of them
  // than the global batch has samples are empty everywhere, and a count in the millions would
  // run for hours.
  if (config.micro_batches > config.batch) {
    throw InvalidArgument(fmt::format(
        "{} micro-batches is more than the {} sample(s) of the global batch: give at most {}",
        config.micro_batches, config.batch, config.batch));
  }
}

namespace {

/// The samples of the first `steps` steps of the run.
std::int64_t samples_through(std::int64_t steps, std::int64_t steps_per_epoch, std::int64_t samples,
                             std::int64_t batch) {
  return (steps / steps_per_epoch) * samples + std::min(samples, (steps % steps_per_epoch) * batch);
}

/// Everything a resume needs, as checkpoint blocks of this rank: the model and optimizer state
/// (model_state) and the scalars of kTrainStateTensors (written by world rank 0).
std::vector<checkpoint::SaveItem> training_state(fsdp::ShardedModel& sharded,
                                                 nn::Optimizer& optimizer,
                                                 std::vector<Tensor>& scalars, bool leader) {
  std::vector<checkpoint::SaveItem> items = model_state(sharded, &optimizer, leader);
  for (std::size_t i = 0; i < std::size(kTrainStateTensors); ++i)
    items.push_back({kTrainStateTensors[i], Shape{}, {}, scalars[i], leader});
  return items;
}

/// The learning-rate schedule as checkpoint metadata: a resume compares it with its own.
std::string schedule_text(const nn::LrSchedule& schedule) {
  return fmt::format("{} base={} warmup={} total_steps={}",
                     schedule.kind == nn::LrSchedule::Kind::cosine ? "cosine" : "constant",
                     schedule.base, schedule.warmup_steps, schedule.total_steps);
}

std::string mode_text(comm::ReductionMode mode) {
  return mode == comm::ReductionMode::exact ? "exact" : "ordered";
}

}  // namespace

double estimate_rank_bytes(const TrainConfig& config, std::int64_t features, std::int64_t ranks) {
  std::vector<double> widths{static_cast<double>(features)};
  for (const std::int64_t h : config.model.hidden)
    widths.push_back(static_cast<double>(h));
  widths.push_back(kClasses);
  double parameters = 0;
  double largest_layer = 0;
  double activations = 0;
  for (std::size_t i = 0; i + 1 < widths.size(); ++i) {
    const double layer =
        widths[i] * widths[i + 1] + widths[i + 1] * (config.model.layernorm ? 3 : 1);
    parameters += layer;
    largest_layer = std::max(largest_layer, layer);
    activations += widths[i + 1];
  }
  const auto replicas = static_cast<double>(
      config.strategy == Strategy::hsdp
          ? (config.replicas > 0 ? config.replicas : std::min<std::int64_t>(2, ranks))
          : 1);
  const double shards =
      config.strategy == Strategy::ddp ? 1.0 : static_cast<double>(ranks) / replicas;
  const double state_copies = config.optimizer == OptimizerKind::adamw ? 4.0 : 3.0;
  const bool exact = config.mode == comm::ReductionMode::exact;
  const double sink = exact ? 28.0 : 4.0;
  // Exact: the other replicas' states of this rank's slice, received for the merge.
  const double replica_group =
      config.strategy == Strategy::ddp ? static_cast<double>(ranks) : replicas;
  const double received =
      exact ? 28.0 * parameters / shards * (replica_group - 1) / replica_group : 0.0;
  const double rows = std::ceil(static_cast<double>(config.batch) / static_cast<double>(ranks));
  // Measured: a thread rank's threads (compute and reduction lanes), queues and communicator
  // state hold about 1.2 MiB whatever the model.
  constexpr double kRankRuntimeBytes = 1.5 * 1024 * 1024;
  return kRankRuntimeBytes + 4.0 * parameters          // the whole model, before sharding
         + 4.0 * state_copies * parameters / shards    // shards: values, grads, optimizer
         + (exact ? 28.0 * parameters / shards : 0.0)  // exact sums carried over a step
         + received +
         (4.0 * (1 + config.prefetch) + 2 * sink) * largest_layer  // gathered, sinks in flight
         + 4.0 * 4.0 * rows * (activations + widths.front());      // activations and gradients
}

TrainResult train(comm::Communicator& world, const Dataset& data, TrainConfig config,
                  const TrainCallbacks& callbacks) {
  validate_config(config, data);
  const auto run_start = Clock::now();
  const bool exact = config.mode == comm::ReductionMode::exact;
  const bool leader = world.rank() == 0;
  config.model.inputs = data.train.features();
  config.model.outputs = kClasses;
  const std::int64_t ranks = world.size();
  const std::int64_t rank = world.rank();
  Placement placement = placement_for(config, ranks);

  config.model.seed = config.seed;
  auto model = nn::make_mlp(config.model);
  const std::vector<nn::Parameter*> parameters = model->parameters();
  const std::int64_t parameter_count = nn::parameter_count(parameters);
  // MeshGroups shares the world communicator; the caller owns it.
  comm::MeshGroups groups(placement.mesh,
                          std::shared_ptr<comm::Communicator>(&world, [](comm::Communicator*) {}));
  fsdp::RuntimeOptions runtime;
  runtime.mode = config.mode;
  runtime.prefetch = config.prefetch;
  fsdp::ShardedModel sharded(*model, groups, runtime);
  if (config.trace) {
    // One time origin for every rank: world rank 0's clock (steady_clock is the machine's
    // monotonic clock, so processes of one machine share it).
    Tensor origin = Tensor::full(Shape{1}, DType::i64, 0.0);
    origin.values<std::int64_t>()[0] = run_start.time_since_epoch().count();
    world.broadcast(origin, 0);
    sharded.tracer().enable(Clock::time_point(Clock::duration(origin.values<std::int64_t>()[0])));
  }
  for (std::size_t i = 0; i < model->size(); ++i) {
    nn::Module& layer = model->at(i);
    if (!layer.parameters().empty()) sharded.fully_shard(layer, placement.config);
  }

  std::unique_ptr<nn::Optimizer> optimizer;
  if (config.optimizer == OptimizerKind::adamw) {
    optimizer = std::make_unique<nn::AdamW>(sharded.optimizer_slots(), config.weight_decay);
  } else {
    optimizer =
        std::make_unique<nn::SGD>(sharded.optimizer_slots(), config.momentum, config.weight_decay);
  }
  sharded.memory().add(fsdp::MemoryKind::optimizer_state, optimizer->state_bytes());
  std::int64_t optimizer_bytes = optimizer->state_bytes();

  const std::int64_t samples = data.train.count;
  const std::int64_t steps_per_epoch = (samples + config.batch - 1) / config.batch;
  const std::int64_t total_steps =
      config.steps > 0 ? config.steps : config.epochs * steps_per_epoch;
  config.schedule.total_steps = total_steps;

  TrainResult result;
  result.parameters = parameter_count;
  result.mesh = placement.description;
  std::int64_t step = 0;

  // The scalars of a checkpoint, in the order of kTrainStateTensors.
  std::vector<Tensor> scalars;
  for (std::size_t i = 0; i < std::size(kTrainStateTensors); ++i)
    scalars.push_back(Tensor::zeros(Shape{}, DType::i64));
  const auto scalar = [&scalars](std::size_t i) -> std::int64_t& {
    return scalars[i].values<std::int64_t>()[0];
  };
  if (!config.resume_dir.empty()) {
    std::vector<checkpoint::SaveItem> state = training_state(sharded, *optimizer, scalars, leader);
    const std::vector<Tensor> loaded =
        checkpoint::load(world, config.resume_dir, load_requests(state));
    // Check the run's position fits this data before anything is overwritten.
    const auto loaded_scalar = [&](const char* name) {
      for (std::size_t i = 0; i < state.size(); ++i)
        if (state[i].name == name) return loaded[i].values<std::int64_t>()[0];
      throw InvalidArgument(fmt::format("no checkpoint tensor '{}'", name));
    };
    if (loaded_scalar("data.batch") != config.batch || loaded_scalar("data.samples") != samples) {
      throw InvalidArgument(fmt::format(
          "checkpoint {} was saved by a run with batch {} over {} samples; this run has batch {} "
          "over {} samples (the data position would not carry over)",
          config.resume_dir, loaded_scalar("data.batch"), loaded_scalar("data.samples"),
          config.batch, samples));
    }
    if (loaded_scalar("train.step") > total_steps) {
      throw InvalidArgument(
          fmt::format("checkpoint {} is at step {}, past the {} steps of this run",
                      config.resume_dir, loaded_scalar("train.step"), total_steps));
    }
    // Only world rank 0 reads the index's metadata; every rank checks the architecture.
    const checkpoint::Index index =
        leader ? checkpoint::read_index(config.resume_dir) : checkpoint::Index{};
    const auto saved_architecture = index.metadata.find("architecture");
    const std::string architecture = comm::broadcast_text(
        world, saved_architecture == index.metadata.end() ? "" : saved_architecture->second, 0);
    if (!architecture.empty() && architecture != architecture_text(config.model)) {
      throw InvalidArgument(
          fmt::format("checkpoint {} holds a model '{}', but this run trains '{}' (--model, "
                      "--activation and --layernorm must match the saving run's)",
                      config.resume_dir, architecture, architecture_text(config.model)));
    }
    restore_model_state(state, loaded, optimizer.get());
    if (const auto saved = index.metadata.find("schedule");
        saved != index.metadata.end() && saved->second != schedule_text(config.schedule)) {
      result.warnings.push_back(fmt::format(
          "the checkpoint's run had the learning-rate schedule '{}', this run has '{}': the "
          "weights will differ from one uninterrupted run (give both runs the whole run's "
          "--epochs or --steps, and stop the first with --stop-after)",
          saved->second, schedule_text(config.schedule)));
    }
    step = scalar(0);
    config.seed = static_cast<std::uint64_t>(scalar(5));
    result.resumed_step = step;
  }
  std::int64_t last_step = total_steps;
  if (config.stop_after > 0) last_step = std::min(last_step, config.stop_after);
  if (config.stop_after_epochs > 0)
    last_step = std::min(last_step, config.stop_after_epochs * steps_per_epoch);
  const auto save_checkpoint = [&] {
    scalar(0) = step;
    scalar(1) = step / steps_per_epoch;
    scalar(2) = step % steps_per_epoch;
    scalar(3) = config.batch;
    scalar(4) = samples;
    scalar(5) = static_cast<std::int64_t>(config.seed);
    const fsdp::Tracer::Span span(sharded.tracer(), "save checkpoint", "checkpoint", "compute");
    const std::vector<checkpoint::SaveItem> state =
        training_state(sharded, *optimizer, scalars, leader);
    checkpoint::SaveOptions options;
    options.keep = config.keep_checkpoints;
    options.metadata = {{"strategy", std::string(config.strategy == Strategy::ddp    ? "ddp"
                                                 : config.strategy == Strategy::fsdp ? "fsdp"
                                                                                     : "hsdp")},
                        {"mesh", placement.description},
                        {"mode", mode_text(config.mode)},
                        {"hidden", fmt::format("{}", fmt::join(config.model.hidden, ","))},
                        {"architecture", architecture_text(config.model)},
                        {"optimizer", config.optimizer == OptimizerKind::adamw ? "adamw" : "sgd"},
                        {"schedule", schedule_text(config.schedule)}};
    result.checkpoints.push_back(checkpoint::save(world, config.save_dir, step, state, options));
  };

  std::int64_t epoch = step / steps_per_epoch;
  std::int64_t first_step = step % steps_per_epoch;
  std::vector<std::uint8_t> labels;
  double total_train_seconds = 0.0;
  std::int64_t total_samples_done = 0;
  const std::int64_t total_samples =
      samples_through(last_step, steps_per_epoch, samples, config.batch) -
      samples_through(step, steps_per_epoch, samples, config.batch);
  fsdp::Tracer& tracer = sharded.tracer();

  while (step < last_step) {
    ++epoch;
    const std::shared_ptr<const std::vector<std::int64_t>> shared_order =
        shared_epoch_order(samples, config.seed, epoch - 1);
    const std::vector<std::int64_t>& order = *shared_order;
    const std::int64_t end_step = std::min(steps_per_epoch, first_step + last_step - step);
    const std::int64_t epoch_samples =
        std::min(samples, end_step * config.batch) - first_step * config.batch;
    double loss_total = 0.0;
    std::int64_t correct_total = 0;
    const auto epoch_start = Clock::now();
    for (std::int64_t s = first_step; s < end_step; ++s) {
      const fsdp::Tracer::Span step_span(tracer, fmt::format("step {}", step + 1), "step", "step");
      const auto step_start = Clock::now();
      const double waited_before = sharded.wait_seconds();
      const std::int64_t start = s * config.batch;
      const std::int64_t global_batch = std::min(config.batch, samples - start);
      const Chunk slice = chunk_extent(global_batch, ranks, rank);
      sharded.zero_grad();
      sharded.set_gradient_divide_factor(static_cast<double>(global_batch));
      kernels::BinnedSums loss_sums(1);
      double loss_local = 0.0;
      std::int64_t correct_local = 0;
      // Every rank runs every micro-batch, empty or not: the collectives are the same on all.
      for (std::int64_t k = 0; k < config.micro_batches; ++k) {
        const bool last = k + 1 == config.micro_batches;
        sharded.set_is_last_backward(last);
        if (config.micro_batch_mode == MicroBatchMode::no_sync) {
          sharded.set_requires_gradient_sync(last);
          sharded.set_requires_all_reduce(true);
        } else {
          sharded.set_requires_gradient_sync(true);
          sharded.set_requires_all_reduce(last);
        }
        const Chunk micro = chunk_extent(slice.size, config.micro_batches, k);
        const Tensor x = gather_inputs(data.train, &order, start + slice.offset + micro.offset,
                                       micro.size, labels);
        const Tensor logits = sharded.forward(x);
        const nn::CrossEntropyResult loss = nn::softmax_cross_entropy(logits, labels);
        if (exact) {
          if (micro.size > 0)
            kernels::add_column_sums(loss_sums, 0, loss.losses.reshape(Shape{micro.size, 1}));
        } else {
          for (const double value : loss.losses.values<double>())
            loss_local += value;
        }
        correct_local += loss.correct;
        sharded.backward(loss.grad_logits);
      }

      Tensor metrics(Shape{2}, DType::f64);
      double batch_loss_sum = 0.0;
      if (exact) {
        Tensor loss_sum(Shape{1}, DType::f64);
        fsdp::reduce_binned_sums(world, loss_sums, 1, loss_sum);
        batch_loss_sum = loss_sum.values<double>()[0];
      } else {
        metrics.values<double>()[1] = loss_local;
      }
      metrics.values<double>()[0] = static_cast<double>(correct_local);
      world.all_reduce(metrics, reduce_options(ReduceOp::sum, comm::ReductionMode::ordered));
      if (!exact) batch_loss_sum = metrics.values<double>()[1];
      correct_total += static_cast<std::int64_t>(metrics.values<double>()[0]);
      loss_total += batch_loss_sum;

      {
        const fsdp::Tracer::Span span(tracer, "optimizer step", "optimizer", "compute");
        optimizer->step(config.schedule.at(step));
      }
      if (optimizer->state_bytes() != optimizer_bytes) {  // SGD makes its buffers lazily
        sharded.memory().add(fsdp::MemoryKind::optimizer_state,
                             optimizer->state_bytes() - optimizer_bytes);
        optimizer_bytes = optimizer->state_bytes();
      }
      ++step;
      result.step_seconds.push_back(seconds_since(step_start));
      result.step_wait_seconds.push_back(sharded.wait_seconds() - waited_before);
      if (!config.save_dir.empty() &&
          ((config.save_every > 0 && step % config.save_every == 0) || step == last_step)) {
        save_checkpoint();
      }
      if (leader && callbacks.on_step) {
        const double elapsed = seconds_since(epoch_start);
        const std::int64_t done = start + global_batch - first_step * config.batch;
        StepProgress progress;
        progress.epoch = epoch;
        progress.samples_done = done;
        progress.samples_total = epoch_samples;
        progress.loss = batch_loss_sum / static_cast<double>(global_batch);
        progress.samples_per_second = elapsed > 0 ? static_cast<double>(done) / elapsed : 0.0;
        const double rate =
            (static_cast<double>(total_samples_done + done)) / (total_train_seconds + elapsed);
        progress.eta_seconds =
            rate > 0 ? static_cast<double>(total_samples - total_samples_done - done) / rate : 0.0;
        callbacks.on_step(progress);
      }
    }
    first_step = 0;
    const double train_seconds = seconds_since(epoch_start);
    total_train_seconds += train_seconds;
    total_samples_done += epoch_samples;

    // Test accuracy: each rank predicts its slice of the test set, in as many forwards as the
    // largest slice needs (the gathers are collective).
    std::int64_t test_correct = 0;
    const Chunk test_slice = chunk_extent(data.test.count, ranks, rank);
    constexpr std::int64_t kEvalRows = 1000;
    const std::int64_t largest = chunk_extent(data.test.count, ranks, 0).size;
    for (std::int64_t first = 0; first < largest; first += kEvalRows) {
      const std::int64_t rows = std::clamp<std::int64_t>(test_slice.size - first, 0, kEvalRows);
      const Tensor x = gather_inputs(
          data.test, nullptr, test_slice.offset + std::min(first, test_slice.size), rows, labels);
      const std::vector<std::int64_t> predicted = nn::predict(sharded.forward(x));
      for (std::int64_t r = 0; r < rows; ++r)
        if (predicted[static_cast<std::size_t>(r)] == labels[static_cast<std::size_t>(r)])
          ++test_correct;
    }
    sharded.reshard();
    Tensor test_metric = Tensor::full(Shape{1}, DType::f64, static_cast<double>(test_correct));
    world.all_reduce(test_metric, reduce_options(ReduceOp::sum, comm::ReductionMode::ordered));

    EpochReport report;
    report.epoch = epoch;
    report.steps = step;
    report.samples = epoch_samples;
    report.train_loss = loss_total / static_cast<double>(epoch_samples);
    report.train_accuracy = static_cast<double>(correct_total) / static_cast<double>(epoch_samples);
    report.test_accuracy =
        data.test.count > 0 ? test_metric.values<double>()[0] / static_cast<double>(data.test.count)
                            : 0.0;
    report.seconds = train_seconds;
    report.samples_per_second =
        train_seconds > 0 ? static_cast<double>(epoch_samples) / train_seconds : 0.0;
    result.epochs.push_back(report);
    if (leader && callbacks.on_epoch) callbacks.on_epoch(report);
  }

  result.steps = step;
  result.test_accuracy = result.epochs.empty() ? 0.0 : result.epochs.back().test_accuracy;
  result.memory_peak = sharded.memory().peak();
  result.memory_peak_by_kind = sharded.memory().peak_by_kind();
  result.digest = sharded.full_parameters_digest();
  // Replicas agree when the largest and the smallest digest over the ranks are equal; the
  // maximum of ~d is ~(minimum of d).
  Tensor digests(Shape{2}, DType::i64);
  const auto mine = static_cast<std::int64_t>(result.digest);
  digests.values<std::int64_t>()[0] = mine;
  digests.values<std::int64_t>()[1] = ~mine;
  world.all_reduce(digests, reduce_options(ReduceOp::max, comm::ReductionMode::ordered));
  result.replicas_identical =
      digests.values<std::int64_t>()[0] == ~digests.values<std::int64_t>()[1];
  if (config.trace) result.trace = fsdp::gather_chrome_trace(world, tracer.events());
  result.seconds = seconds_since(run_start);
  return result;
}

}  // namespace meshtensor::train
