#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <tuple>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <meshtensor/checkpoint/checkpoint.hpp>
#include <meshtensor/comm/agree.hpp>
#include <meshtensor/comm/binned_reduction.hpp>
#include <meshtensor/comm/mesh_groups.hpp>
#include <meshtensor/core/digest.hpp>
#include <meshtensor/core/error.hpp>
#include <meshtensor/core/memory.hpp>
#include <meshtensor/core/profile.hpp>
#include <meshtensor/fsdp/sharded_model.hpp>
#include <meshtensor/generate/generator.hpp>
#include <meshtensor/generate/load.hpp>
#include <meshtensor/kernels/binned_sum.hpp>
#include <meshtensor/kernels/matmul.hpp>
#include <meshtensor/kernels/simd.hpp>
#include <meshtensor/mesh/layout.hpp>
#include <meshtensor/mesh/parse.hpp>
#include <meshtensor/nn/layers.hpp>
#include <meshtensor/nn/loss.hpp>
#include <meshtensor/tp/style.hpp>
#include <meshtensor/train/model_state.hpp>
#include <meshtensor/train/settings.hpp>
#include <meshtensor/train/trainer.hpp>
#include <meshtensor/train/training_model.hpp>

namespace meshtensor::train {

Strategy parse_strategy(const std::string& text) {
  if (text == "ddp") return Strategy::ddp;
  if (text == "fsdp") return Strategy::fsdp;
  if (text == "hsdp") return Strategy::hsdp;
  throw ParseError(fmt::format("unknown strategy '{}' (expected ddp, fsdp or hsdp)", text));
}

const char* strategy_name(Strategy strategy) {
  switch (strategy) {
    case Strategy::ddp:
      return "ddp";
    case Strategy::fsdp:
      return "fsdp";
    case Strategy::hsdp:
      return "hsdp";
  }
  return "?";
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

std::int64_t mesh_dim(const TrainConfig& config, std::string_view name) {
  if (!config.mesh) return 1;
  const auto& names = config.mesh->names();
  const auto at = std::find(names.begin(), names.end(), name);
  return at == names.end() ? 1 : config.mesh->size(static_cast<int>(at - names.begin()));
}

bool has_mesh_dim(const TrainConfig& config, std::string_view name) {
  return config.mesh && std::ranges::find(config.mesh->names(), name) != config.mesh->names().end();
}

std::int64_t data_ranks(const TrainConfig& config) {
  return mesh_dim(config, "dp") * mesh_dim(config, "fsdp");
}

std::string mesh_text(const TrainConfig& c) {
  if (has_mesh_dim(c, "cp")) {
    const bool pipeline = has_mesh_dim(c, "pp");
    return fmt::format("{}{}x{}x{}x{} ({}dp x fsdp x cp x tp)",
                       pipeline ? fmt::format("{}x", mesh_dim(c, "pp")) : "", mesh_dim(c, "dp"),
                       mesh_dim(c, "fsdp"), mesh_dim(c, "cp"), mesh_dim(c, "tp"),
                       pipeline ? "pp x " : "");
  }
  if (has_mesh_dim(c, "pp")) {
    return fmt::format("{}x{}x{}x{} (pp x dp x fsdp x tp)", mesh_dim(c, "pp"), mesh_dim(c, "dp"),
                       mesh_dim(c, "fsdp"), mesh_dim(c, "tp"));
  }
  return fmt::format("{}x{}x{} (dp x fsdp x tp)", mesh_dim(c, "dp"), mesh_dim(c, "fsdp"),
                     mesh_dim(c, "tp"));
}

std::int64_t virtual_stages(const TrainConfig& config) {
  // Without a pipeline there is nothing to interleave: the model runs as one stage.
  const bool pipeline = mesh_dim(config, "pp") > 1;
  if (config.pipeline_schedule != pp::ScheduleKind::interleaved_1f1b || !pipeline) return 1;
  return config.virtual_stages > 0 ? config.virtual_stages : 2;
}

DeviceMesh parse_named_mesh(const std::string& shape, const std::string& names) {
  DeviceMesh mesh = parse_mesh(shape, names);  // sizes, name count, repeated names
  for (const std::string& name : mesh.names()) {
    if (name != "pp" && name != "dp" && name != "fsdp" && name != "cp" && name != "tp") {
      throw ParseError(fmt::format(
          "`names`: unknown mesh dim name '{}' (expected pp, dp, fsdp, cp and tp, each at most "
          "once)",
          name));
    }
  }
  return mesh;
}

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

comm::CollectiveOptions reduce_options(ReduceOp op, comm::ReductionMode mode) {
  comm::CollectiveOptions options;
  options.op = op;
  options.mode = mode;
  return options;
}

/// The samples of the first `steps` steps of the run.
std::int64_t samples_through(std::int64_t steps, std::int64_t steps_per_epoch, std::int64_t samples,
                             std::int64_t batch) {
  return (steps / steps_per_epoch) * samples + std::min(samples, (steps % steps_per_epoch) * batch);
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

/// Loss sum and correct count over some targets, summed over every rank: the loss exactly (the
/// same figure on every layout), the count in integers.
struct Totals {
  double loss = 0.0;
  std::int64_t correct = 0;
};

/// Sums, over the ranks of `world`, the losses collected in `losses` (exactly) and `correct`.
Totals reduce_totals(comm::Communicator& world, kernels::BinnedSums& losses, std::int64_t correct) {
  Tensor loss_sum(Shape{1}, DType::f64);
  comm::reduce_binned_sums(world, losses, 1, loss_sum);
  Tensor count = Tensor::full(Shape{1}, DType::f64, static_cast<double>(correct));
  world.all_reduce(count, reduce_options(ReduceOp::sum, comm::ReductionMode::ordered));
  return {loss_sum.values<double>()[0], static_cast<std::int64_t>(count.values<double>()[0])};
}

/// One step's micro-batches through this rank's pipeline chunks: the forwards keep their
/// activations in a stash per (chunk, micro-batch) until the backward that needs them, and the
/// memory account follows what is held.
class PipelineStep : public pp::StageWork {
 public:
  PipelineStep(TrainingModel& model, const std::vector<Batch>& batches, kernels::BinnedSums& losses,
               std::int64_t& correct)
      : model_(model), batches_(batches), losses_(losses), correct_(correct) {}

  Tensor first_input(std::int64_t micro_batch) override { return batch(micro_batch).input; }
  Shape boundary_shape(std::int64_t micro_batch) override {
    const Shape& tokens = batch(micro_batch).input.shape();
    return model_.boundary_shape(tokens[0], tokens[1]);
  }
  Tensor forward(std::int64_t chunk, std::int64_t micro_batch, const Tensor& input) override {
    pp::StageModule& stage = model_.chunk(static_cast<std::size_t>(chunk));
    const fsdp::Tracer::Span span(model_.sharded().tracer(),
                                  action_name("forward", chunk, micro_batch), "pipeline",
                                  "compute");
    Tensor output = model_.forward_chunk(static_cast<std::size_t>(chunk), input,
                                         batch(micro_batch).input.shape()[1]);
    Held& held = held_[{chunk, micro_batch}];
    held.stash = nn::ActivationStash::take(stage);
    held.bytes = held.stash.bytes();
    held_bytes_ += held.bytes;
    model_.note_activations(held_bytes_);
    return output;
  }
  Tensor loss_gradient(std::int64_t micro_batch, const Tensor& output) override {
    const Batch& b = batch(micro_batch);
    const nn::CrossEntropyResult loss = model_.row_losses(output, b.targets, losses_);
    correct_ += loss.correct;
    return loss.grad_logits;
  }
  Tensor backward(std::int64_t chunk, std::int64_t micro_batch,
                  const Tensor& grad_output) override {
    pp::StageModule& stage = model_.chunk(static_cast<std::size_t>(chunk));
    const fsdp::Tracer::Span span(model_.sharded().tracer(),
                                  action_name("backward", chunk, micro_batch), "pipeline",
                                  "compute");
    Held held = std::move(held_.at({chunk, micro_batch}));
    held_.erase({chunk, micro_batch});
    held.stash.restore(stage);
    model_.prepare_chunk_backward(static_cast<std::size_t>(chunk), micro_batch,
                                  static_cast<std::int64_t>(batches_.size()));
    Tensor grad_input = model_.backward_chunk(static_cast<std::size_t>(chunk), grad_output,
                                              batch(micro_batch).input.shape()[1]);
    const std::int64_t recomputed = stage.take_backward_peak();
    model_.note_activations(held_bytes_ - held.bytes + std::max(held.bytes, recomputed));
    held_bytes_ -= held.bytes;
    model_.note_activations(held_bytes_);
    return grad_input;
  }

 private:
  struct Held {
    nn::ActivationStash stash;
    std::int64_t bytes = 0;
  };
  /// The trace name of an action (formatted only while tracing).
  std::string action_name(const char* kind, std::int64_t chunk, std::int64_t micro_batch) {
    if (!model_.sharded().tracer().enabled()) return {};
    return fmt::format("{} micro-batch {} chunk {}", kind, micro_batch, chunk);
  }
  const Batch& batch(std::int64_t micro_batch) const {
    return batches_.at(static_cast<std::size_t>(micro_batch));
  }

  TrainingModel& model_;
  const std::vector<Batch>& batches_;
  kernels::BinnedSums& losses_;
  std::int64_t& correct_;
  std::map<std::pair<std::int64_t, std::int64_t>, Held> held_;
  std::int64_t held_bytes_ = 0;
};

/// One train() call on one rank: the model, its runtime and optimizer, and the position in the
/// run. Each part of a run is one method.
class TrainingRun {
 public:
  TrainingRun(comm::Communicator& world, const Task& task, TrainConfig config,
              const TrainCallbacks& callbacks, ReplicaLink* replicas);
  TrainResult run();

 private:
  /// Where the run is in the epoch it is taking and in the period it will report.
  struct EpochProgress {
    std::int64_t epoch = 0;     // 1-based; 0 before the first
    std::int64_t end_step = 0;  // the step of the epoch the run stops before
    std::int64_t samples = 0;   // samples of the epoch this run takes
    std::int64_t done = 0;
    Clock::time_point start;
    Totals period;
    std::int64_t period_samples = 0;
    Clock::time_point period_start;
  };
  void start_epoch(EpochProgress& progress) const;
  /// The step's work (train_step, or its replicated form) with its profile and figures.
  void take_step(EpochProgress& progress);
  void end_step_bookkeeping(EpochProgress& progress, std::int64_t s, const Totals& totals,
                            Clock::time_point step_start, double waited);
  void build_model();
  void resume();
  void load_init();
  void save_checkpoint();
  std::vector<checkpoint::SaveItem> training_state();
  std::int64_t& scalar(std::size_t i) { return scalars_[i].values<std::int64_t>()[0]; }
  /// One optimizer step on global batch `s` of `epoch`.
  Totals train_step(std::int64_t epoch, std::int64_t s);
  /// The gradients of global batch `s` of `epoch` (this group's share of it when replicated)
  /// and the batch's loss totals, without stepping.
  Totals compute_gradients(std::int64_t epoch, std::int64_t s);
  /// Clips (when asked) and steps the optimizer on the gradients.
  void apply_gradients();
  /// train_step of the run's step across replica groups, redone until every member finished
  /// it; `healed` is set when this group first took a live member's state and with it the
  /// quorum's step.
  Totals replicated_step(bool& healed);
  /// Receives (behind the quorum) or passes on the training state over the quorum's link; false
  /// when the link failed on any rank of the group.
  bool heal();
  /// The checkpoint scalars of kTrainStateTensors set from the run's position.
  void write_scalars();
  void run_micro_batch(const Batch& batch, std::int64_t k, kernels::BinnedSums& losses,
                       std::int64_t& correct);
  Totals evaluate();
  void report(std::int64_t epoch, const Totals& totals, std::int64_t samples, double seconds);
  void progress(std::int64_t epoch, std::int64_t done, std::int64_t epoch_samples,
                double batch_loss, Clock::time_point epoch_start);
  void finish();
  void verify_generator();
  std::vector<generate::Completion> generate_on_one_rank(
      const std::vector<generate::Request>& requests);

  comm::Communicator& world_;
  const Task& task_;
  TrainConfig config_;
  const TrainCallbacks& callbacks_;
  ReplicaLink* replicas_;                          // a fault-tolerant run's groups, or none
  std::optional<ReplicaLink::StepQuorum> quorum_;  // the step's, with replicas_
  const Clock::time_point run_start_ = Clock::now();
  const bool exact_;
  const bool leader_;
  const std::int64_t ranks_;
  const std::int64_t rank_;
  std::unique_ptr<TrainingModel> model_;
  fsdp::ShardedModel* sharded_ = nullptr;  // model_'s
  tp::TensorParallel* tp_ = nullptr;       // model_'s (with a tp mesh dim)
  std::int64_t samples_ = 0;               // per epoch
  std::int64_t steps_per_epoch_ = 0;
  std::int64_t total_steps_ = 0;
  std::int64_t last_step_ = 0;
  std::int64_t step_ = 0;
  std::vector<Tensor> scalars_;  // a checkpoint's scalars, in the order of kTrainStateTensors
  double seconds_done_ = 0.0;    // seconds of the steps taken (for the time left)
  std::int64_t samples_done_ = 0;
  std::int64_t samples_to_do_ = 0;
  TrainResult result_;
};

TrainingRun::TrainingRun(comm::Communicator& world, const Task& task, TrainConfig config,
                         const TrainCallbacks& callbacks, ReplicaLink* replicas)
    : world_(world),
      task_(task),
      config_(std::move(config)),
      callbacks_(callbacks),
      replicas_(replicas),
      exact_(config_.mode == comm::ReductionMode::exact),
      leader_(world.rank() == 0),
      ranks_(world.size()),
      rank_(world.rank()) {
  samples_ = task_.samples();
  steps_per_epoch_ = (samples_ + config_.batch - 1) / config_.batch;
  total_steps_ = config_.steps > 0 ? config_.steps : config_.epochs * steps_per_epoch_;
  config_.schedule.total_steps = total_steps_;
  for (std::size_t i = 0; i < std::size(kTrainStateTensors); ++i)
    scalars_.push_back(Tensor::zeros(Shape{}, DType::i64));
}

void TrainingRun::build_model() {
  model_ = std::make_unique<TrainingModel>(world_, task_, config_, config_.seed);
  sharded_ = &model_->sharded();
  tp_ = model_->tp();
  result_.parameters = model_->parameter_count();
  result_.parameter_tensors = model_->parameter_tensors();
  result_.mesh = model_->layout().description;
  if (const pp::Pipeline* pipeline = model_->pipeline()) {
    TrainResult::PipelineFigures& figures = result_.pipeline;
    figures.stages = pipeline->stages();
    figures.schedule = pp::schedule_name(pipeline->config().kind);
    figures.micro_batches = pipeline->config().micro_batches;
    figures.theoretical_bubble = pp::theoretical_bubble(pipeline->config());
    figures.stage_units = model_->stage_units();
  }
  result_.parallel_plan = model_->parallel_plan();
  if (config_.param_dtype == DType::bf16 && !kernels::bf16_dot_products_used()) {
    result_.warnings.push_back(fmt::format(
        "bf16 compute: the kernels ({}) have no bf16 dot-product instruction here, so the bf16 "
        "products run its emulation on the f32 FMAs: the same bits, slower than f32 products",
        kernels::machine_description()));
  }
  if (config_.trace) {
    // One time origin for every rank: world rank 0's clock (steady_clock is the machine's
    // monotonic clock, so processes of one machine share it).
    Tensor origin = Tensor::full(Shape{1}, DType::i64, 0.0);
    origin.values<std::int64_t>()[0] = run_start_.time_since_epoch().count();
    world_.broadcast(origin, 0);
    sharded_->tracer().enable(Clock::time_point(Clock::duration(origin.values<std::int64_t>()[0])));
  }
}

/// The openings (half the context) of the first validation windows, each continued to the
/// context's end with the run's seed: TrainConfig::verify_generator's requests.
std::vector<generate::Request> opening_requests(const Task& task, std::int64_t context,
                                                std::uint64_t seed) {
  const std::int64_t opening = std::max<std::int64_t>(1, context / 2);
  const std::int64_t count = std::min<std::int64_t>(4, task.eval_samples());
  const Batch windows = task.eval_batch(0, count);
  std::vector<generate::Request> requests;
  for (std::int64_t r = 0; r < count; ++r) {
    const auto row = windows.input.values<std::int64_t>().subspan(
        static_cast<std::size_t>(r * windows.input.shape()[1]), static_cast<std::size_t>(opening));
    requests.push_back({{row.begin(), row.end()}, context - opening, {0.8, 0, seed}});
  }
  return requests;
}

/// The completions of `requests` by the generator over the whole model, built on this rank alone
/// (a one-rank layout) from the run's parameters. Collective (the gathers).
std::vector<generate::Completion> TrainingRun::generate_on_one_rank(
    const std::vector<generate::Request>& requests) {
  const std::vector<Tensor> values = model_->whole_parameters();
  std::unique_ptr<nn::Module> built;
  {
    const nn::WeightsToBeLoaded copied_next;
    built = task_.make_model(config_.seed);
  }
  auto& decoder = dynamic_cast<nn::Decoder&>(*built);
  const std::vector<nn::Parameter*> whole = decoder.parameters();
  for (std::size_t i = 0; i < whole.size(); ++i)
    whole[i]->value.copy_from(values[i]);
  const bool exact = config_.mode == comm::ReductionMode::exact;
  decoder.set_exact_sums(exact);
  if (config_.param_dtype == DType::bf16) nn::set_compute_dtype(decoder, DType::bf16);
  generate::GeneratorOptions options;
  options.exact_logprobs = exact;
  return generate::Generator(decoder, options).generate(requests);
}

/// TrainConfig::verify_generator: the generator on one rank continues the first validation
/// windows' openings, then this run's forward and loss on its own layout score the same tokens.
/// Collective.
void TrainingRun::verify_generator() {
  const std::int64_t context = task_.targets_per_sample();  // a window's tokens
  const std::vector<generate::Request> requests = opening_requests(task_, context, config_.seed);
  const std::vector<generate::Completion> made = generate_on_one_rank(requests);
  const auto count = static_cast<std::int64_t>(requests.size());
  const std::int64_t length = context - 1;  // prompt + every generated token but the last
  Tensor tokens(Shape{count, length}, DType::i64);
  std::vector<std::int32_t> labels(static_cast<std::size_t>(count * length), 0);
  std::vector<std::size_t> scored_rows;  // the rows whose label is a generated token
  for (std::int64_t r = 0; r < count; ++r) {
    std::vector<std::int64_t> sequence = requests[static_cast<std::size_t>(r)].prompt;
    const std::size_t first = static_cast<std::size_t>(r * length) + sequence.size() - 1;
    const auto& generated = made[static_cast<std::size_t>(r)].tokens;
    sequence.insert(sequence.end(), generated.begin(), generated.end() - 1);
    std::copy(sequence.begin(), sequence.end(), tokens.values<std::int64_t>().begin() + r * length);
    for (std::size_t i = 0; i < generated.size(); ++i) {
      labels[first + i] = static_cast<std::int32_t>(generated[i]);
      scored_rows.push_back(first + i);
    }
  }
  const Tensor logits = model_->forward_logits(tokens);
  const nn::CrossEntropyResult scored = tp::parallel_cross_entropy(
      logits.reshape(Shape{count * length, logits.shape()[2]}), labels, model_->loss().tp,
      model_->loss().classes, model_->loss().exact_sums);
  sharded_->reshard();
  std::vector<double> generated_logprobs;
  for (const generate::Completion& c : made)
    generated_logprobs.insert(generated_logprobs.end(), c.logprobs.begin(), c.logprobs.end());
  TrainResult::GeneratorCheck& check = result_.generator_check;
  for (std::size_t i = 0; i < scored_rows.size(); ++i) {
    const double trainer = -scored.losses.values<double>()[scored_rows[i]];
    ++check.tokens;
    if (std::bit_cast<std::uint64_t>(trainer) ==
        std::bit_cast<std::uint64_t>(generated_logprobs[i]))
      ++check.identical;
    check.largest_difference =
        std::max(check.largest_difference, std::abs(trainer - generated_logprobs[i]));
  }
}

/// Everything a resume needs, as checkpoint blocks of this rank: the model and optimizer state
/// (model_state) and the scalars of kTrainStateTensors (written by world rank 0).
std::vector<checkpoint::SaveItem> TrainingRun::training_state() {
  std::vector<checkpoint::SaveItem> items = model_->state();
  for (std::size_t i = 0; i < std::size(kTrainStateTensors); ++i)
    items.push_back({kTrainStateTensors[i], Shape{}, {}, scalars_[i], leader_});
  return items;
}

void TrainingRun::load_init() {
  // World rank 0 reads what the init holds; every rank checks it is this run's model.
  std::string architecture;
  std::exception_ptr failure;
  if (leader_) {
    try {
      architecture =
          nn::decoder_architecture_text(generate::model_architecture(config_.init_dir),
                                        generate::model_tokenizer(config_.init_dir)->name());
    } catch (...) {
      failure = std::current_exception();
    }
  }
  comm::throw_if_any_failed(world_, failure);
  architecture = comm::broadcast_text(world_, architecture, 0);
  if (architecture != task_.architecture()) {
    throw InvalidArgument(fmt::format("init {} holds the model '{}', but this run trains '{}'",
                                      config_.init_dir, architecture, task_.architecture()));
  }
  read_model_weights(world_, config_.init_dir, model_->sharded());
}

void TrainingRun::resume() {
  // Only world rank 0 reads the index's metadata.
  const checkpoint::Index index =
      leader_ ? checkpoint::read_index(config_.resume_dir) : checkpoint::Index{};
  const auto kind = index.metadata.find("kind");
  const std::string saved_by =
      comm::broadcast_text(world_, kind == index.metadata.end() ? "train" : kind->second, 0);
  if (saved_by != "train") {
    throw InvalidArgument(fmt::format(
        "checkpoint {} was saved by meshtensor {}, not by train: it holds no training position "
        "(start rl from it with `init`, or generate from it)",
        config_.resume_dir, saved_by));
  }
  // Every rank checks the architecture before any tensor is read.
  const auto saved_architecture = index.metadata.find("architecture");
  const std::string architecture = comm::broadcast_text(
      world_, saved_architecture == index.metadata.end() ? "" : saved_architecture->second, 0);
  if (!architecture.empty() && architecture != task_.architecture()) {
    const auto family = [](const std::string& text) { return text.substr(0, text.find(' ')); };
    throw InvalidArgument(fmt::format(
        "checkpoint {} holds the {} model '{}', but this run trains the {} model '{}' (`model`, "
        "`activation` and `layernorm` must match the saving run's)",
        config_.resume_dir, family(architecture), architecture, family(task_.architecture()),
        task_.architecture()));
  }
  std::vector<checkpoint::SaveItem> state = training_state();
  const std::vector<Tensor> loaded =
      checkpoint::load(world_, config_.resume_dir, load_requests(state));
  // Check the run's position fits this data before anything is overwritten.
  const auto loaded_scalar = [&](const char* name) {
    for (std::size_t i = 0; i < state.size(); ++i)
      if (state[i].name == name) return loaded[i].values<std::int64_t>()[0];
    throw InvalidArgument(fmt::format("no checkpoint tensor '{}'", name));
  };
  if (loaded_scalar("data.batch") != config_.batch || loaded_scalar("data.samples") != samples_) {
    throw InvalidArgument(fmt::format(
        "checkpoint {} was saved by a run with batch {} over {} samples; this run has batch {} "
        "over {} samples (the data position would not carry over)",
        config_.resume_dir, loaded_scalar("data.batch"), loaded_scalar("data.samples"),
        config_.batch, samples_));
  }
  if (loaded_scalar("train.step") > total_steps_) {
    throw InvalidArgument(fmt::format("checkpoint {} is at step {}, past the {} steps of this run",
                                      config_.resume_dir, loaded_scalar("train.step"),
                                      total_steps_));
  }
  restore_model_state(state, loaded, model_->optimizer());
  if (const auto saved = index.metadata.find("schedule");
      saved != index.metadata.end() && saved->second != schedule_text(config_.schedule)) {
    result_.warnings.push_back(fmt::format(
        "the checkpoint's run had the learning-rate schedule '{}', this run has '{}': the "
        "weights will differ from one uninterrupted run (give both runs the whole run's "
        "`epochs` or `steps`, and stop the first with `stop_after`)",
        saved->second, schedule_text(config_.schedule)));
  }
  step_ = scalar(0);
  config_.seed = static_cast<std::uint64_t>(scalar(5));
  result_.resumed_step = step_;
}

void TrainingRun::write_scalars() {
  scalar(0) = step_;
  scalar(1) = step_ / steps_per_epoch_;
  scalar(2) = step_ % steps_per_epoch_;
  scalar(3) = config_.batch;
  scalar(4) = samples_;
  scalar(5) = static_cast<std::int64_t>(config_.seed);
}

void TrainingRun::save_checkpoint() {
  write_scalars();
  const fsdp::Tracer::Span span(sharded_->tracer(), "save checkpoint", "checkpoint", "compute");
  const std::vector<checkpoint::SaveItem> state = training_state();
  checkpoint::SaveOptions options;
  options.keep = config_.keep_checkpoints;
  options.metadata = {{"strategy", strategy_name(config_.strategy)},
                      {"mesh", model_->layout().description},
                      {"mode", mode_text(config_.mode)},
                      {"architecture", task_.architecture()},
                      {"optimizer", config_.optimizer == OptimizerKind::adamw ? "adamw" : "sgd"},
                      {"schedule", schedule_text(config_.schedule)}};
  options.metadata.merge(task_.checkpoint_metadata());
  result_.checkpoints.push_back(checkpoint::save(world_, config_.save_dir, step_, state, options));
}

void TrainingRun::run_micro_batch(const Batch& batch, std::int64_t k, kernels::BinnedSums& losses,
                                  std::int64_t& correct) {
  model_->prepare_micro_batch(k, config_.micro_batches, config_.micro_batch_mode);
  const Tensor logits = sharded_->forward(batch.input);
  const std::int64_t kept = nn::kept_bytes(model_->local_module());
  model_->note_activations(kept);
  const nn::CrossEntropyResult loss = model_->row_losses(logits, batch.targets, losses);
  correct += loss.correct;
  sharded_->backward(loss.grad_logits);
  if (auto* stage = dynamic_cast<pp::StageModule*>(&model_->local_module()))
    model_->note_activations(std::max(kept, stage->take_backward_peak()));
  model_->note_activations(0);
}

Totals TrainingRun::compute_gradients(std::int64_t epoch, std::int64_t s) {
  const std::int64_t start = s * config_.batch;
  const std::int64_t global_batch = std::min(config_.batch, samples_ - start);
  // Replica groups split the global batch by sample index in member order.
  const Chunk share = quorum_ ? chunk_extent(global_batch, quorum_->members, quorum_->member)
                              : Chunk{0, global_batch};
  const Chunk slice = chunk_extent(share.size, model_->data_ranks(), model_->data_rank());
  sharded_->zero_grad();
  sharded_->set_gradient_divide_factor(
      static_cast<double>(global_batch * task_.targets_per_sample()));
  kernels::BinnedSums losses(1);
  std::int64_t correct = 0;
  // Every rank runs every micro-batch, empty or not: the collectives are the same on all.
  std::vector<Batch> batches;
  for (std::int64_t k = 0; k < config_.micro_batches; ++k) {
    const ProfileScope profile(ProfileRow::data);
    const Chunk micro = chunk_extent(slice.size, config_.micro_batches, k);
    batches.push_back(model_->local_batch(task_.train_batch(
        config_.seed, epoch, start + share.offset + slice.offset + micro.offset, micro.size)));
  }
  if (pp::Pipeline* pipeline = model_->pipeline()) {
    PipelineStep work(*model_, batches, losses, correct);
    result_.pipeline.step_bubbles.push_back(pipeline->run_step(work).bubble());
    sharded_->end_step();
  } else {
    for (std::int64_t k = 0; k < config_.micro_batches; ++k)
      run_micro_batch(batches[static_cast<std::size_t>(k)], k, losses, correct);
  }
  if (quorum_ && quorum_->replicate) {
    // The other groups' totals join at each rank's place first (exact sums, integer counts).
    comm::all_reduce_binned_sums(*quorum_->replicate, losses, "replica groups' losses");
    Tensor count = Tensor::full(Shape{1}, DType::f64, static_cast<double>(correct));
    quorum_->replicate->all_reduce(count,
                                   reduce_options(ReduceOp::sum, comm::ReductionMode::ordered));
    correct = static_cast<std::int64_t>(count.values<double>()[0]);
  }
  return reduce_totals(world_, losses, correct);
}

void TrainingRun::apply_gradients() {
  if (config_.clip_grad_norm > 0.0)
    result_.grad_norms.push_back(model_->clip_gradients(config_.clip_grad_norm));
  model_->optimizer_step(config_.schedule.at(step_));
}

Totals TrainingRun::train_step(std::int64_t epoch, std::int64_t s) {
  const Totals totals = compute_gradients(epoch, s);
  apply_gradients();
  return totals;
}

Totals TrainingRun::replicated_step(bool& healed) {
  for (bool fresh = false;; fresh = true) {
    quorum_ = replicas_->begin_step(step_, fresh);
    for (std::string& note : replicas_->take_notes())
      result_.warnings.push_back(std::move(note));
    if (!quorum_) continue;
    sharded_->set_replicate_group(quorum_->replicate);
    if (quorum_->heal_root) {
      const std::int64_t before = step_;
      if (!heal()) continue;
      healed = healed || step_ != before;
    }
    // Behind the quorum, a healed group takes the quorum's step with the others.
    const Totals totals = compute_gradients(step_ / steps_per_epoch_, step_ % steps_per_epoch_);
    // A failed cross-group collective left garbage behind on some rank: the group redoes the
    // step in the next quorum, before the optimizer touched anything.
    if (comm::on_any_rank(world_, replicas_->failed())) continue;
    apply_gradients();
    return totals;
  }
}

bool TrainingRun::heal() {
  const auto start = Clock::now();
  write_scalars();
  const std::vector<checkpoint::SaveItem> items = training_state();
  std::vector<Tensor> values;
  std::size_t bytes = 0;
  for (const checkpoint::SaveItem& item : items) {
    values.push_back(item.data.clone());
    bytes += values.back().bytes().size();
  }
  std::vector<char> state(bytes);
  char* at = state.data();
  for (const Tensor& value : values) {
    std::memcpy(at, value.bytes().data(), value.bytes().size());
    at += value.bytes().size();
  }
  if (comm::on_any_rank(world_, !replicas_->broadcast(state, *quorum_->heal_root))) return false;
  if (quorum_->step == step_) return true;  // a member at the step: it passed its state on
  at = state.data();
  for (Tensor& value : values) {
    std::memcpy(value.bytes().data(), at, value.bytes().size());
    at += value.bytes().size();
  }
  restore_model_state(items, values, model_->optimizer());
  step_ = scalar(0);
  result_.healed_steps.push_back(step_);
  result_.heal_seconds.push_back(seconds_since(start));
  return true;
}

/// Loss and correct count over the task's evaluation set: each rank takes its slice, in as many
/// forwards as the largest slice needs (the gathers are collective).
Totals TrainingRun::evaluate() {
  const std::int64_t count = task_.eval_samples();
  const Chunk slice = chunk_extent(count, model_->data_ranks(), model_->data_rank());
  // Up to 1000 targets a forward, and logits of about 64 MiB (f32) over a large vocabulary: a
  // row's loss does not depend on the rows evaluated beside it.
  constexpr std::int64_t kEvalLogitFloats = std::int64_t{1} << 24;
  const std::int64_t targets_per_forward = std::clamp<std::int64_t>(
      kEvalLogitFloats / std::max<std::int64_t>(1, task_.classes()), 1, 1000);
  const std::int64_t rows_per_forward =
      std::max<std::int64_t>(1, targets_per_forward / task_.targets_per_sample());
  const std::int64_t largest = chunk_extent(count, model_->data_ranks(), 0).size;
  kernels::BinnedSums losses(1);
  std::int64_t correct = 0;
  for (std::int64_t first = 0; first < largest; first += rows_per_forward) {
    const std::int64_t rows = std::clamp<std::int64_t>(slice.size - first, 0, rows_per_forward);
    const Batch batch =
        model_->local_batch(task_.eval_batch(slice.offset + std::min(first, slice.size), rows));
    correct +=
        model_->row_losses(model_->forward_local(batch.input), batch.targets, losses).correct;
  }
  sharded_->reshard();
  return reduce_totals(world_, losses, correct);
}

void TrainingRun::report(std::int64_t epoch, const Totals& totals, std::int64_t samples,
                         double seconds) {
  const Totals eval = evaluate();
  const auto per_sample = static_cast<double>(task_.targets_per_sample());
  const double targets = static_cast<double>(samples) * per_sample;
  const double eval_targets = static_cast<double>(task_.eval_samples()) * per_sample;
  EpochReport report;
  report.epoch = epoch;
  report.steps = step_;
  report.samples = samples;
  report.train_loss = totals.loss / targets;
  report.train_accuracy = static_cast<double>(totals.correct) / targets;
  report.test_loss = eval_targets > 0 ? eval.loss / eval_targets : std::nan("");
  report.test_accuracy = eval_targets > 0 ? static_cast<double>(eval.correct) / eval_targets : 0.0;
  report.seconds = seconds;
  report.samples_per_second = seconds > 0 ? static_cast<double>(samples) / seconds : 0.0;
  report.targets_per_second = report.samples_per_second * per_sample;
  result_.epochs.push_back(report);
  if (leader_ && callbacks_.on_epoch) callbacks_.on_epoch(report);
}

void TrainingRun::progress(std::int64_t epoch, std::int64_t done, std::int64_t epoch_samples,
                           double batch_loss, Clock::time_point epoch_start) {
  if (!leader_ || !callbacks_.on_step) return;
  const double elapsed = seconds_since(epoch_start);
  StepProgress progress;
  progress.epoch = epoch;
  progress.samples_done = done;
  progress.samples_total = epoch_samples;
  progress.loss = batch_loss;
  progress.samples_per_second = elapsed > 0 ? static_cast<double>(done) / elapsed : 0.0;
  const double rate = static_cast<double>(samples_done_) / seconds_done_;
  progress.eta_seconds =
      seconds_done_ > 0 ? static_cast<double>(samples_to_do_ - samples_done_) / rate : 0.0;
  callbacks_.on_step(progress);
}

void TrainingRun::finish() {
  result_.steps = step_;
  if (!result_.epochs.empty()) {
    result_.test_accuracy = result_.epochs.back().test_accuracy;
    result_.test_loss = result_.epochs.back().test_loss;
  }
  if (config_.sample) {
    result_.sample = task_.sample(
        [this](const Tensor& tokens) {
          const Tensor logits = model_->forward_logits(tokens);
          return model_->whole_logits(logits);
        },
        config_.seed);
    sharded_->reshard();
  }
  result_.memory_peak = sharded_->memory().peak();
  result_.memory_peak_by_kind = sharded_->memory().peak_by_kind();
  result_.activation_peak_bytes = result_.memory_peak_by_kind.of(fsdp::MemoryKind::activations);
  {
    Tensor mine = Tensor::full(Shape{1}, DType::i64, 0.0);
    mine.values<std::int64_t>()[0] = result_.activation_peak_bytes;
    Tensor all(Shape{ranks_}, DType::i64);
    comm::CollectiveOptions options;
    options.label = "activation peaks";
    world_.all_gather(mine, all, {}, options);
    result_.activation_peaks.assign(all.values<std::int64_t>().begin(),
                                    all.values<std::int64_t>().end());
  }
  result_.digest = model_->full_digest();
  result_.evaluated = task_.eval_samples() > 0;
  if (!result_.evaluated) {
    result_.warnings.push_back(fmt::format(
        "there is no {0} set ({1}): no {0} loss, no logits digest{2}", task_.eval_name(),
        task_.eval_name() == "validation"
            ? "the text has too few records: every 20th record is validation text"
            : "the data has no evaluation samples",
        config_.verify_generator ? ", and no generator check (it continues validation text)" : ""));
  }
  if (config_.verify_generator && result_.evaluated) verify_generator();
  if (result_.evaluated) {
    const Batch batch = task_.eval_batch(0, std::min<std::int64_t>(4, task_.eval_samples()));
    const Tensor logits = model_->forward_logits(batch.input);
    result_.logits_digest = model_->whole_logits(logits).digest();
    sharded_->reshard();
  }
  // Replicas agree when the largest and the smallest digest over the ranks are equal; the
  // maximum of ~d is ~(minimum of d).
  Tensor digests(Shape{2}, DType::i64);
  const auto mine = static_cast<std::int64_t>(result_.digest);
  digests.values<std::int64_t>()[0] = mine;
  digests.values<std::int64_t>()[1] = ~mine;
  world_.all_reduce(digests, reduce_options(ReduceOp::max, comm::ReductionMode::ordered));
  result_.replicas_identical =
      digests.values<std::int64_t>()[0] == ~digests.values<std::int64_t>()[1];
  if (config_.trace) result_.trace = fsdp::gather_chrome_trace(world_, sharded_->tracer().events());
  if (!leader_) result_.sample.clear();
  result_.seconds = seconds_since(run_start_);
}

void TrainingRun::start_epoch(EpochProgress& progress) const {
  const std::int64_t first_step = step_ % steps_per_epoch_;
  progress.epoch = step_ / steps_per_epoch_ + 1;
  progress.end_step =
      std::min(steps_per_epoch_, last_step_ - (progress.epoch - 1) * steps_per_epoch_);
  progress.samples =
      std::min(samples_, progress.end_step * config_.batch) - first_step * config_.batch;
  progress.done = 0;
  progress.start = Clock::now();
  progress.period = {};
  progress.period_samples = 0;
  progress.period_start = progress.start;
}

void TrainingRun::take_step(EpochProgress& progress) {
  const fsdp::Tracer::Span step_span(sharded_->tracer(), fmt::format("step {}", step_ + 1), "step",
                                     "step");
  const auto step_start = Clock::now();
  const double waited_before = sharded_->wait_seconds();
  const bool log_step = tp_ != nullptr && result_.step_seconds.empty();
  if (log_step) tp_->log().enable(true);
  // The profile covers the steps after the first two (which allocate and warm the caches).
  const bool profiled = result_.step_seconds.size() >= 2;
  if (profiled) ThreadProfile::resume();
  bool healed = false;
  const Totals totals = replicas_ != nullptr
                            ? replicated_step(healed)
                            : train_step(progress.epoch - 1, step_ % steps_per_epoch_);
  if (healed) {
    // The group now stands at the quorum's step, with the state of a live peer.
    start_epoch(progress);
    samples_to_do_ = samples_through(last_step_, steps_per_epoch_, samples_, config_.batch) -
                     samples_through(step_, steps_per_epoch_, samples_, config_.batch);
    samples_done_ = 0;
    seconds_done_ = 0;
  }
  if (profiled) {
    ThreadProfile::pause();
    result_.profiled_seconds += seconds_since(step_start);
    ++result_.profiled_steps;
    const ProfileSeconds rows = ThreadProfile::take();
    for (std::size_t r = 0; r < kProfileRows; ++r)
      result_.profile[r] += rows[r];
    result_.step_profiles.push_back(rows);
  }
  if (log_step) {
    tp_->log().enable(false);
    result_.parallel_log = tp_->log().to_text();
    for (const tp::CommEvent& event : tp_->log().events())
      ++result_.parallel_collectives[event.phase + " " + event.collective];
    tp_->log().clear();
  }
  end_step_bookkeeping(progress, step_ % steps_per_epoch_, totals, step_start,
                       sharded_->wait_seconds() - waited_before);
}

void TrainingRun::end_step_bookkeeping(EpochProgress& progress, std::int64_t s,
                                       const Totals& totals, Clock::time_point step_start,
                                       double waited) {
  const std::int64_t global_batch = std::min(config_.batch, samples_ - s * config_.batch);
  ++step_;
  progress.period.loss += totals.loss;
  progress.period.correct += totals.correct;
  progress.period_samples += global_batch;
  progress.done += global_batch;
  samples_done_ += global_batch;
  seconds_done_ += seconds_since(step_start);
  result_.step_seconds.push_back(seconds_since(step_start));
  result_.step_end_times.push_back(
      std::chrono::duration<double>(Clock::now().time_since_epoch()).count());
  result_.step_wait_seconds.push_back(waited);
  const bool saves = quorum_ ? quorum_->member == 0 : true;  // one replica group saves
  if (!config_.save_dir.empty() && saves &&
      ((config_.save_every > 0 && step_ % config_.save_every == 0) || step_ == last_step_)) {
    save_checkpoint();
  }
  this->progress(progress.epoch, progress.done, progress.samples,
                 totals.loss / static_cast<double>(global_batch * task_.targets_per_sample()),
                 progress.start);
  const bool period_ends =
      s + 1 == progress.end_step || (config_.eval_every > 0 && step_ % config_.eval_every == 0);
  if (period_ends) {
    report(progress.epoch, progress.period, progress.period_samples,
           seconds_since(progress.period_start));
    progress.period = {};
    progress.period_samples = 0;
    progress.period_start = Clock::now();
  }
}

TrainResult TrainingRun::run() {
  build_model();
  if (!config_.resume_dir.empty()) {
    resume();
  } else if (!config_.init_dir.empty()) {
    load_init();
  }
  last_step_ = total_steps_;
  if (config_.stop_after > 0) last_step_ = std::min(last_step_, config_.stop_after);
  if (config_.stop_after_epochs > 0)
    last_step_ = std::min(last_step_, config_.stop_after_epochs * steps_per_epoch_);
  samples_to_do_ = samples_through(last_step_, steps_per_epoch_, samples_, config_.batch) -
                   samples_through(step_, steps_per_epoch_, samples_, config_.batch);
  EpochProgress progress;
  while (step_ < last_step_) {
    if (step_ / steps_per_epoch_ + 1 != progress.epoch) start_epoch(progress);
    take_step(progress);
  }
  finish();
  return std::move(result_);
}

}  // namespace

namespace {

/// The pipeline and activation-checkpointing parts of validate_config.
void validate_pipeline(const TrainConfig& config, const Task& task) {
  const auto* language = dynamic_cast<const LanguageModelling*>(&task);
  const bool pipeline = mesh_dim(config, "pp") > 1;
  if (language == nullptr &&
      (pipeline || config.activation_checkpointing != pp::Checkpointing::none)) {
    throw InvalidArgument(fmt::format("{} splits a GPT's blocks; this run trains '{}'",
                                      pipeline ? "a pp mesh dim" : "activation checkpointing",
                                      task.architecture()));
  }
  if (pipeline) {
    if (language->model().tie) {
      throw InvalidArgument(fmt::format(
          "model {}: the tied head reads the token embedding's table, which a pp mesh dim of {} "
          "would put on the first and the last stage; train a tied model without a pp dim, or "
          "give tie=0",
          nn::decoder_spec_text(language->model()), mesh_dim(config, "pp")));
    }
  }
  if (!pipeline) {
    if (config.virtual_stages > 1) {
      throw InvalidArgument(
          fmt::format("{} virtual stages need a pipeline: name a pp mesh dim of size 2 or more",
                      config.virtual_stages));
    }
    return;
  }
  const pp::ScheduleConfig schedule{
      config.pipeline_schedule, mesh_dim(config, "pp"),
      config.virtual_stages > 0 ? config.virtual_stages : virtual_stages(config),
      config.micro_batches};
  pp::check_schedule(schedule);
  if (config.pipeline_schedule != pp::ScheduleKind::gpipe &&
      config.micro_batches < mesh_dim(config, "pp")) {
    throw InvalidArgument(fmt::format(
        "{} keeps every pipeline rank busy with one micro-batch each: {} micro-batches is fewer "
        "than the {} pp ranks (give `micro_batches` {} or more, or the gpipe schedule)",
        pp::schedule_name(config.pipeline_schedule), config.micro_batches, mesh_dim(config, "pp"),
        mesh_dim(config, "pp")));
  }
  pp::split_blocks(language->model().layers, schedule.stages());
  if (config.micro_batch_mode != MicroBatchMode::no_sync) {
    throw InvalidArgument(
        "a pipeline reduces each stage's gradients once, after its last micro-batch: the "
        "reduce-scatter micro-batch mode does not apply (leave `micro_batch_mode` no-sync)");
  }
}

/// cp needs sequences (a language model) long enough that none of its 2·cp chunks is empty.
void validate_context_parallel(const TrainConfig& config, const Task& task) {
  const std::int64_t cp = mesh_dim(config, "cp");
  if (cp <= 1) return;
  if (dynamic_cast<const LanguageModelling*>(&task) == nullptr) {
    throw InvalidArgument(
        fmt::format("context parallelism splits sequences: cp {} needs a language model, not '{}'",
                    cp, task.architecture()));
  }
  const std::int64_t length = task.targets_per_sample();
  if (!context_splits(length, cp)) {
    std::vector<std::int64_t> degrees;  // the first few that do split it
    for (std::int64_t d = 2; d <= length / 2 && degrees.size() < 16; ++d)
      if (context_splits(length, d)) degrees.push_back(d);
    throw InvalidArgument(fmt::format(
        "context parallelism: the context of {} positions does not split over cp {} (2·cp = {} "
        "chunks of {} positions leave the last empty); cp degrees that split it: {}",
        length, cp, 2 * cp, (length + 2 * cp - 1) / (2 * cp),
        degrees.empty() ? std::string("none") : fmt::format("{}", fmt::join(degrees, ", "))));
  }
}

}  // namespace

void validate_config(const TrainConfig& config, const Task& task) {
  const auto positive = [](std::int64_t value, const char* what) {
    if (value < 1) throw InvalidArgument(fmt::format("{} must be at least 1, got {}", what, value));
  };
  if (config.verify_generator && dynamic_cast<const LanguageModelling*>(&task) == nullptr) {
    throw InvalidArgument(
        fmt::format("`verify_generator` checks a language model's generator; this run trains '{}'",
                    task.architecture()));
  }
  positive(config.batch, "the batch");
  positive(config.micro_batches, "the number of micro-batches");
  if (config.save_every < 0 || config.stop_after < 0 || config.stop_after_epochs < 0 ||
      config.keep_checkpoints < 0 || config.eval_every < 0) {
    throw InvalidArgument(fmt::format(
        "save_every {}, stop_after {}, stop_after_epochs {}, keep_checkpoints {} and eval_every "
        "{} must be >= 0",
        config.save_every, config.stop_after, config.stop_after_epochs, config.keep_checkpoints,
        config.eval_every));
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
  // Every gradient element and the loss sum get one addend per target of the global batch.
  const double targets =
      static_cast<double>(config.batch) * static_cast<double>(task.targets_per_sample());
  if (targets > static_cast<double>(kernels::kMaxBinnedAddends)) {
    throw InvalidArgument(fmt::format(
        "a batch of {} sample(s) of {} target(s) each is above the {} targets an exact sum takes",
        config.batch, task.targets_per_sample(), kernels::kMaxBinnedAddends));
  }
  if (task.samples() == 0) throw InvalidArgument("the training set is empty");
  if (config.mesh) task.check_tensor_parallel(mesh_dim(config, "tp"));
  validate_context_parallel(config, task);
  if (!(config.clip_grad_norm >= 0.0 && config.clip_grad_norm <= 1e6)) {
    throw InvalidArgument(fmt::format("the gradient clip norm must be within [0, 1e6], got {}",
                                      config.clip_grad_norm));
  }
  // Micro-batches split each rank's slice of the global batch (some may be empty); more of them
  // than the global batch has samples are empty everywhere, and a count in the millions would
  // run for hours.
  if (config.micro_batches > config.batch) {
    throw InvalidArgument(fmt::format(
        "{} micro-batches is more than the {} sample(s) of the global batch: give at most {}",
        config.micro_batches, config.batch, config.batch));
  }
  if (config.sequence_parallel && !has_mesh_dim(config, "tp")) {
    throw InvalidArgument(fmt::format(
        "sequence parallelism splits the sequence over the tp mesh dim, and the mesh {} has "
        "none: name a tp dim (e.g. `mesh` 2x2 and `names` fsdp,tp) or leave it off",
        config.mesh ? mesh_text(config) : std::string("of this run")));
  }
  validate_pipeline(config, task);
  if (!config.save_dir.empty()) checkpoint::check_save_root(config.save_dir);
}

namespace {

/// Context parallelism's gathers: whole sequences of this rank's samples, held at once.
double context_gather_bytes(const TrainConfig& config, const ModelFootprint& model) {
  if (mesh_dim(config, "cp") <= 1) return 0.0;
  const double samples = std::ceil(static_cast<double>(config.batch) /
                                   static_cast<double>(data_ranks(config) * config.micro_batches));
  return 4.0 * samples * model.sequence_gather_floats;
}

}  // namespace

double estimate_rank_bytes(const TrainConfig& config, const Task& task, std::int64_t ranks) {
  const ModelFootprint footprint = task.footprint();
  // A named mesh splits the model over tp and pp (each rank holds 1 / (tp x pp) of the
  // parameters, and 1 / tp of a group) and shards it over fsdp, replicated over dp.
  const auto tp = static_cast<double>(mesh_dim(config, "tp"));
  ModelFootprint model = footprint;
  model.parameters /= tp * static_cast<double>(mesh_dim(config, "pp"));
  model.largest_unit /= tp;
  model.next_largest_unit /= tp;
  const double parameters = model.parameters;
  double replicas =
      config.strategy == Strategy::hsdp
          ? static_cast<double>(config.replicas > 0 ? config.replicas
                                                    : std::min<std::int64_t>(2, ranks))
          : 1.0;
  double shards = config.strategy == Strategy::ddp ? 1.0 : static_cast<double>(ranks) / replicas;
  double data = static_cast<double>(ranks);
  if (config.mesh) {
    replicas = static_cast<double>(mesh_dim(config, "dp"));
    shards = static_cast<double>(mesh_dim(config, "fsdp"));
    data = static_cast<double>(data_ranks(config));
  }
  const double state_copies = config.optimizer == OptimizerKind::adamw ? 4.0 : 3.0;
  const bool exact = config.mode == comm::ReductionMode::exact;
  const double sink = exact ? 28.0 : 4.0;
  // Exact sums carried through a step: every group's, from its first backward to the step's
  // last, when the step has several micro-batches; otherwise one group's at a time.
  const double held = config.micro_batches > 1 ? parameters : model.largest_unit;
  const double carried = exact ? 28.0 * held / shards : 0.0;
  // Exact: the other replicas' states of this rank's slice, received for the merge.
  const double replica_group =
      config.strategy == Strategy::ddp && !config.mesh ? static_cast<double>(ranks) : replicas;
  const double received = exact ? 28.0 * held / shards * (replica_group - 1) / replica_group : 0.0;
  // A micro-batch's samples hold activations at once; a pipeline holds several micro-batches.
  const double micro_batches =
      has_mesh_dim(config, "pp") ? 1.0 : static_cast<double>(config.micro_batches);
  const double rows = std::ceil(static_cast<double>(config.batch) / data / micro_batches);
  // Measured: a thread rank's threads (compute and reduction lanes), queues and communicator
  // state hold about 1.2 MiB whatever the model.
  constexpr double kRankRuntimeBytes = 1.5 * 1024 * 1024;
  // Backward's temporaries, per-thread buffers and the allocator's free blocks: measured peaks
  // (the default GPT, long-context GPTs) stay below 1.5x the activations counted.
  constexpr double kActivationMargin = 1.5;
  // Exact weight gradients over sequences: f32 per-sample products, up to 32 samples or 2^22
  // elements at a time (at least one weight's worth).
  const double unit = static_cast<double>(model.largest_unit);
  const double per_sample_products = 4.0 * std::min(32.0 * unit, std::max(4194304.0, unit));
  const double steady =
      kRankRuntimeBytes + 4.0 * state_copies * parameters / shards  // values, grads, optimizer
      + carried + received + 4.0 * (1 + config.prefetch) * model.largest_unit  // gathered
      + sink * (model.largest_unit + model.next_largest_unit)                  // sinks in flight
      + kActivationMargin * 4.0 * rows * (model.activation_floats + model.input_floats) +
      (exact ? rows * model.exact_scratch_bytes : 0.0)  // exact kernels' packed operands
      + (exact ? per_sample_products : 0.0) + context_gather_bytes(config, model) +
      (exact && shards > 1 ? 12.0 * unit : 0.0);  // a reduce-scatter's bins and digit plane
  // Before splitting and sharding each rank builds the whole model: drawn values and zeroed
  // gradients, which the shards replace a group at a time; a model whose weights are read next
  // touches neither.
  const bool loaded = !config.init_dir.empty() || !config.resume_dir.empty();
  const double build = loaded ? 0.0 : 8.0 * footprint.parameters + 8.0 * parameters / shards;
  // Measured: freed blocks the storage cache keeps for reuse, the data and the allocator's
  // slack add up to a tenth of what is live at the peak.
  constexpr double kSlack = 1.1;
  return kSlack * std::max(steady, kRankRuntimeBytes + build);
}

namespace {

/// What every rank of a run must agree on: the model, the data's size and every setting
/// (paths are compared as given).
std::string run_description(const TrainConfig& config, const Task& task) {
  return fmt::format("{}, {} samples; {}", task.architecture(), task.samples(),
                     settings_json(config).dump());
}

}  // namespace

void require_training_memory(const TrainConfig& config, const Task& task,
                             std::int64_t process_ranks, std::int64_t ranks) {
  const double per_rank = estimate_rank_bytes(config, task, ranks);
  require_memory(per_rank * static_cast<double>(process_ranks),
                 fmt::format("training model {} on {} rank(s) in this process ({} a rank)",
                             task.architecture(), process_ranks, format_bytes(per_rank)));
}

CheckedConfig check_config(TrainConfig config, const Task& task, std::int64_t process_ranks,
                           std::int64_t ranks) {
  validate_config(config, task);
  require_training_memory(config, task, process_ranks, ranks);
  return {std::move(config), ranks};
}

std::string run_fingerprint(const TrainConfig& config, const Task& task, std::int64_t ranks) {
  std::vector<std::string> entries{
      fmt::format("model {}", task.architecture()), fmt::format("samples {}", task.samples()),
      config.mesh ? fmt::format("layout {}", mesh_text(config))
                  : fmt::format("layout {} over {} ranks", strategy_name(config.strategy), ranks)};
  nlohmann::json settings = settings_json(config);
  for (const char* local : {"trace", "save", "save_every", "keep_checkpoints", "resume", "init",
                            "stop_after", "stop_after_epochs", "verify_generator", "sample",
                            "eval_every", "mesh", "strategy", "tp_dim"})
    settings.erase(local);
  for (const auto& [key, value] : settings.items())
    entries.push_back(fmt::format("{} {}", key, value.dump()));
  return fmt::format("{}", fmt::join(entries, "; "));
}

TrainResult train(comm::Communicator& world, const Task& task, const CheckedConfig& checked,
                  const TrainCallbacks& callbacks, ReplicaLink* replicas) {
  if (checked.ranks() != world.size()) {
    throw InvalidArgument(fmt::format("the config was checked for {} ranks, but the run has {}",
                                      checked.ranks(), world.size()));
  }
  comm::check_same_on_every_rank(world, "train()'s model, data and configuration",
                                 run_description(checked.config(), task));
  TrainingRun run(world, task, checked.config(), callbacks, replicas);
  return run.run();
}

TrainResult train(comm::Communicator& world, const Task& task, TrainConfig config,
                  const TrainCallbacks& callbacks, ReplicaLink* replicas) {
  validate_config(config, task);
  // Every caller is refused a run too big for this process before any rank builds its model; a
  // threads world's ranks all live in this process.
  std::exception_ptr failure;
  if (world.rank() == 0) {
    try {
      require_training_memory(config, task, world.backend() == "threads" ? world.size() : 1,
                              world.size());
    } catch (...) {
      failure = std::current_exception();
    }
  }
  comm::throw_if_any_failed(world, failure);
  const CheckedConfig checked(std::move(config), world.size());
  return train(world, task, checked, callbacks, replicas);
}

}  // namespace meshtensor::train
