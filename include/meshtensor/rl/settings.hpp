#pragma once

#include <string_view>

#include <meshtensor/train/settings.hpp>

namespace meshtensor::rl {

/// The trainer's settings an RL run takes (fields of train::TrainSettings): `meshtensor rl`'s
/// flags and `mt.rl()`'s keywords of the same names.
inline constexpr std::string_view kTrainerSettingFields[] = {
    "lr",   "warmup",   "schedule", "optimizer", "weight_decay",      "clip_grad_norm",
    "micro_batches", "mode", "seed", "strategy", "mesh", "names", "sequence_parallel",
    "save", "save_every", "keep_checkpoints", "resume"};

/// True when `name` is one of kTrainerSettingFields.
bool is_trainer_setting(std::string_view name);

/// train::TrainSettings with RL's defaults where they differ from training's: learning rate
/// 3e-4, a constant schedule, exact mode and a gradient clip norm of 1.
train::TrainSettings trainer_settings();

}  // namespace meshtensor::rl
