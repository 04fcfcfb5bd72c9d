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

}  // namespace meshtensor::train
