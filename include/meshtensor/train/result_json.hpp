#pragma once

#include <cstdint>

#include <nlohmann/json.hpp>

#include <meshtensor/train/task.hpp>
#include <meshtensor/train/trainer.hpp>

namespace meshtensor::train {

/// One epoch's (or evaluation's) report as JSON: epoch, steps, train_loss, train_accuracy,
/// `<eval>_loss` and `<eval>_accuracy` (eval: the task's eval_name(), "test" or "validation"),
/// samples_per_second, tokens_per_second (language models), seconds. What `train --json` prints
/// per report and what each entry of the result's "epochs" holds.
nlohmann::json epoch_json(const EpochReport& report, const Task& task);

/// The result of a training run as JSON: the one schema of `meshtensor train --json`'s final
/// line and of Python's `mt.train()` (docs/training.md lists the keys). `config` is the run's,
/// `ranks` the world's size.
nlohmann::json result_json(const TrainResult& result, const Task& task, const TrainConfig& config,
                           std::int64_t ranks);

/// Model FLOPs utilisation of training steps: the model FLOP of a step (Task::footprint()'s
/// training_flops_per_target times the targets of a global batch) over `step_seconds`, against
/// the measured f32 FMA peak of the cores `ranks` ranks use (at most the hardware threads).
struct Utilisation {
  double model_flops_per_target = 0;
  double model_flops_per_second = 0;
  double peak_flops_per_second = 0;
  double mfu = 0;  ///< model_flops_per_second / peak_flops_per_second
};
/// See Utilisation.
Utilisation utilisation(const Task& task, const TrainConfig& config, std::int64_t ranks,
                        double step_seconds);

}  // namespace meshtensor::train
