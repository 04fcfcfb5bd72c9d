#include <chrono>
#include <memory>
#include <optional>

#include <fmt/format.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/kernels/binned_sum.hpp>
#include <meshtensor/mesh/layout.hpp>
#include <meshtensor/nn/gradients.hpp>
#include <meshtensor/nn/loss.hpp>
#include <meshtensor/train/trainer.hpp>

namespace meshtensor::train {

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

comm::CollectiveOptions reduce_options(ReduceOp op, comm::ReductionMode mode) {
  comm::CollectiveOptions options;
  options.op = op;
  options.mode = mode;
  return options;
}

/// Merges the binned sums of every rank and rounds (exact sum) / divisor into `rounded` (f32 or
/// f64 [count]) on every rank. The bins agree on their maximum; then each rank takes one slice of
/// the elements: the digit sums of its slice are reduce-scattered to it (integers far below 2^53,
/// so any order adds them exactly), it rounds them, and the rounded slices are all-gathered. The
/// rounding work is split over the ranks and the gathered values are 4 or 8 bytes per element
/// instead of the 24 of the digits.
void reduce_binned(comm::Communicator& world, kernels::BinnedSums& sums, std::int64_t divisor,
                   const Tensor& rounded) {
  Tensor bins = sums.bins.clone();
  world.all_reduce(bins, reduce_options(ReduceOp::max, comm::ReductionMode::ordered));
  kernels::align_bins(sums, bins);
  const std::int64_t count = sums.count();
  const std::int64_t ranks = world.size();
  std::vector<std::int64_t> counts;
  for (std::int64_t r = 0; r < ranks; ++r)
    counts.push_back(chunk_extent(count, ranks, r).size);
  const Chunk mine = chunk_extent(count, ranks, world.rank());
  kernels::BinnedSums slice(mine.size);
  slice.bins.copy_from(bins.narrow(0, mine.offset, mine.size));
  const auto plane = [](const Tensor& digits, std::int64_t index, std::int64_t length) {
    return digits.narrow(0, index, 1).reshape(Shape{length});
  };
  for (std::int64_t p = 0; p < 3; ++p) {
    world.reduce_scatter(plane(sums.digits, p, count), plane(slice.digits, p, mine.size), counts,
                         reduce_options(ReduceOp::sum, comm::ReductionMode::ordered));
  }
  Tensor rounded_slice(Shape{mine.size}, rounded.dtype());
  kernels::round_binned_sums(slice, divisor, rounded_slice);
  world.all_gather(rounded_slice, rounded, counts);
}

void validate(const TrainConfig& config, const Dataset& data) {
  const auto positive = [](std::int64_t value, const char* what) {
    if (value < 1) throw InvalidArgument(fmt::format("{} must be at least 1, got {}", what, value));
  };
  positive(config.batch, "the batch");
  positive(config.micro_batches, "the number of micro-batches");
  if (config.steps < 0) throw InvalidArgument(fmt::format("steps {} is negative", config.steps));
  if (config.steps == 0) positive(config.epochs, "the number of epochs");
  if (config.mode == comm::ReductionMode::exact && config.batch > kernels::kMaxBinnedAddends) {
    throw InvalidArgument(fmt::format("a batch of {} is above the {} samples exact mode sums",
                                      config.batch, kernels::kMaxBinnedAddends));
  }
  if (data.train.count == 0) throw InvalidArgument("the training set is empty");
}

}  // namespace

TrainResult train(comm::Communicator& world, const Dataset& data, TrainConfig config,
                  const TrainCallbacks& callbacks) {
  validate(config, data);
  const auto run_start = Clock::now();
  const bool exact = config.mode == comm::ReductionMode::exact;
  const bool leader = world.rank() == 0;
  config.model.inputs = data.train.features();
  config.model.outputs = kClasses;
  auto model = nn::make_mlp(config.model);
  const std::vector<nn::Parameter*> parameters = model->parameters();

  std::optional<nn::DenseGradients> dense;
  std::optional<nn::BinnedGradients> binned;
  if (exact) {
    binned.emplace(parameters);
  } else {
    dense.emplace(parameters);
  }
  nn::GradientSink& sink = exact ? static_cast<nn::GradientSink&>(*binned) : *dense;
  const Tensor gradient_means(Shape{exact ? nn::parameter_count(parameters) : 0}, DType::f32);

  std::unique_ptr<nn::Optimizer> optimizer;
  if (config.optimizer == OptimizerKind::adamw) {
    optimizer = std::make_unique<nn::AdamW>(nn::slots_of(parameters), config.weight_decay);
  } else {
    optimizer =
        std::make_unique<nn::SGD>(nn::slots_of(parameters), config.momentum, config.weight_decay);
  }

  const std::int64_t samples = data.train.count;
  const std::int64_t steps_per_epoch = (samples + config.batch - 1) / config.batch;
  const std::int64_t total_steps =
      config.steps > 0 ? config.steps : config.epochs * steps_per_epoch;
  config.schedule.total_steps = total_steps;
  const std::int64_t ranks = world.size();
  const std::int64_t rank = world.rank();

  TrainResult result;
  result.parameters = nn::parameter_count(parameters);
  std::int64_t step = 0;
  std::int64_t epoch = 0;
  std::vector<std::uint8_t> labels;
  double total_train_seconds = 0.0;
  std::int64_t total_samples_done = 0;
  // Whole epochs, then the first steps of one more.
  const std::int64_t total_samples =
      (total_steps / steps_per_epoch) * samples +
      std::min(samples, (total_steps % steps_per_epoch) * config.batch);

  while (step < total_steps) {
    ++epoch;
    const std::vector<std::int64_t> order = epoch_order(samples, config.seed, epoch - 1);
    const std::int64_t epoch_steps = std::min(steps_per_epoch, total_steps - step);
    const std::int64_t epoch_samples = std::min(samples, epoch_steps * config.batch);
    double loss_total = 0.0;
    std::int64_t correct_total = 0;
    const auto epoch_start = Clock::now();
    for (std::int64_t s = 0; s < epoch_steps; ++s) {
      const std::int64_t start = s * config.batch;
      const std::int64_t global_batch = std::min(config.batch, samples - start);
      const Chunk slice = chunk_extent(global_batch, ranks, rank);
      if (exact) {
        binned->clear();
      } else {
        dense->clear();
      }
      kernels::BinnedSums loss_sums(1);
      double loss_local = 0.0;
      std::int64_t correct_local = 0;
      for (std::int64_t k = 0; k < config.micro_batches; ++k) {
        const Chunk micro = chunk_extent(slice.size, config.micro_batches, k);
        if (micro.size == 0) continue;
        const Tensor x = gather_inputs(data.train, &order, start + slice.offset + micro.offset,
                                       micro.size, labels);
        const Tensor logits = model->forward(x);
        const nn::CrossEntropyResult loss = nn::softmax_cross_entropy(logits, labels);
        if (exact) {
          kernels::add_column_sums(loss_sums, 0, loss.losses.reshape(Shape{micro.size, 1}));
        } else {
          for (const double value : loss.losses.values<double>())
            loss_local += value;
        }
        correct_local += loss.correct;
        model->backward(loss.grad_logits, sink, /*need_input_grad=*/false);
      }

      // One reduction of the gradient sums, then the mean over the global batch.
      Tensor metrics(Shape{2}, DType::f64);
      double batch_loss_sum = 0.0;
      if (exact) {
        reduce_binned(world, binned->sums(), global_batch, gradient_means);
        binned->set_gradients(gradient_means);
        Tensor loss_sum(Shape{1}, DType::f64);
        reduce_binned(world, loss_sums, 1, loss_sum);
        batch_loss_sum = loss_sum.values<double>()[0];
      } else {
        world.all_reduce(dense->sums(), reduce_options(ReduceOp::sum, config.mode));
        dense->finish(global_batch);
        metrics.values<double>()[1] = loss_local;
      }
      metrics.values<double>()[0] = static_cast<double>(correct_local);
      world.all_reduce(metrics, reduce_options(ReduceOp::sum, comm::ReductionMode::ordered));
      if (!exact) batch_loss_sum = metrics.values<double>()[1];
      correct_total += static_cast<std::int64_t>(metrics.values<double>()[0]);
      loss_total += batch_loss_sum;

      optimizer->step(config.schedule.at(step));
      ++step;
      if (leader && callbacks.on_step) {
        const double elapsed = seconds_since(epoch_start);
        const std::int64_t done = start + global_batch;
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
    const double train_seconds = seconds_since(epoch_start);
    total_train_seconds += train_seconds;
    total_samples_done += epoch_samples;

    // Test accuracy: each rank predicts its slice of the test set.
    std::int64_t test_correct = 0;
    const Chunk test_slice = chunk_extent(data.test.count, ranks, rank);
    constexpr std::int64_t kEvalRows = 1000;
    for (std::int64_t first = 0; first < test_slice.size; first += kEvalRows) {
      const std::int64_t rows = std::min(kEvalRows, test_slice.size - first);
      const Tensor x = gather_inputs(data.test, nullptr, test_slice.offset + first, rows, labels);
      const std::vector<std::int64_t> predicted = nn::predict(model->forward(x));
      for (std::int64_t r = 0; r < rows; ++r)
        if (predicted[static_cast<std::size_t>(r)] == labels[static_cast<std::size_t>(r)])
          ++test_correct;
    }
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
  result.digest = nn::parameters_digest(parameters);
  // Replicas agree when the largest and the smallest digest over the ranks are equal; the
  // maximum of ~d is ~(minimum of d).
  Tensor digests(Shape{2}, DType::i64);
  const auto mine = static_cast<std::int64_t>(result.digest);
  digests.values<std::int64_t>()[0] = mine;
  digests.values<std::int64_t>()[1] = ~mine;
  world.all_reduce(digests, reduce_options(ReduceOp::max, comm::ReductionMode::ordered));
  result.replicas_identical =
      digests.values<std::int64_t>()[0] == ~digests.values<std::int64_t>()[1];
  result.seconds = seconds_since(run_start);
  return result;
}

}  // namespace meshtensor::train
