#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <meshtensor/comm/communicator.hpp>
#include <meshtensor/nn/mlp.hpp>
#include <meshtensor/nn/optim.hpp>
#include <meshtensor/train/dataset.hpp>

namespace meshtensor::train {

/// Which optimizer steps the weights.
enum class OptimizerKind : std::uint8_t { adamw, sgd };

/// "adamw" or "sgd"; ParseError naming the text otherwise.
OptimizerKind parse_optimizer(const std::string& text);

/// Everything a data-parallel training run depends on. The same config on any number of ranks
/// sees the same global batches in the same order.
struct TrainConfig {
  nn::MlpConfig model;
  std::int64_t epochs = 10;        ///< used when steps == 0
  std::int64_t steps = 0;          ///< total optimizer steps; 0: run `epochs` whole epochs
  std::int64_t batch = 256;        ///< global batch (the last batch of an epoch may be smaller)
  std::int64_t micro_batches = 1;  ///< each rank's slice is split into this many pieces
  OptimizerKind optimizer = OptimizerKind::adamw;
  nn::LrSchedule schedule;  ///< base rate, warmup and kind; total_steps is set by train()
  double weight_decay = 0.0;
  double momentum = 0.9;  ///< SGD only
  comm::ReductionMode mode = comm::ReductionMode::ordered;
  std::uint64_t seed = 0;  ///< initial weights and the data order
};

/// Progress inside an epoch (for a progress bar).
struct StepProgress {
  std::int64_t epoch = 0;          ///< 1-based
  std::int64_t samples_done = 0;   ///< samples of this epoch so far
  std::int64_t samples_total = 0;  ///< samples this epoch will see
  double loss = 0.0;               ///< mean loss of the last global batch
  double samples_per_second = 0.0;
  double eta_seconds = 0.0;  ///< until the end of the run
};

/// One finished epoch (or the partial epoch a --steps run ends in).
struct EpochReport {
  std::int64_t epoch = 0;
  std::int64_t steps = 0;    ///< optimizer steps taken so far in the run
  std::int64_t samples = 0;  ///< samples of this epoch
  double train_loss = 0.0;   ///< mean over the epoch's samples
  double train_accuracy = 0.0;
  double test_accuracy = 0.0;
  double samples_per_second = 0.0;
  double seconds = 0.0;
};

/// The end of a run.
struct TrainResult {
  std::vector<EpochReport> epochs;
  double test_accuracy = 0.0;
  std::uint64_t digest = 0;         ///< of the trained weights (nn::parameters_digest)
  bool replicas_identical = false;  ///< every rank ended with the digest of rank 0
  std::int64_t steps = 0;
  std::int64_t parameters = 0;
  double seconds = 0.0;
};

/// Callbacks run on world rank 0 only.
struct TrainCallbacks {
  std::function<void(const StepProgress&)> on_step;
  std::function<void(const EpochReport&)> on_epoch;
};

/// Trains data-parallel on every rank of `world` (call it on all of them): every rank holds the
/// whole model, takes its Shard(0)-style slice of every global batch, splits it into micro-batches,
/// sums gradients locally, and one reduction per step in config.mode forms the gradient of the
/// mean loss over the global batch; then every rank steps. In exact mode the weights are the same
/// bits for any rank count, micro-batch split and backend; in ordered mode the replicas are the
/// same bits on every rank and a rerun with the same layout repeats them.
TrainResult train(comm::Communicator& world, const Dataset& data, TrainConfig config,
                  const TrainCallbacks& callbacks = {});

}  // namespace meshtensor::train
