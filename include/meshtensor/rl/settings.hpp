#pragma once

#include <string_view>

#include <meshtensor/core/settings.hpp>
#include <meshtensor/rl/grpo.hpp>
#include <meshtensor/rl/rewards.hpp>
#include <meshtensor/train/settings.hpp>

namespace meshtensor::rl {

/// The trainer's settings an RL run takes: fields of train::TrainSettings, also fields of
/// RlSettings (RL's defaults where they differ: lr 3e-4, a constant schedule, exact mode, a
/// gradient clip norm of 1).
inline constexpr std::string_view kTrainerSettingFields[] = {"lr",
                                                             "warmup",
                                                             "schedule",
                                                             "optimizer",
                                                             "weight_decay",
                                                             "clip_grad_norm",
                                                             "micro_batches",
                                                             "mode",
                                                             "param_dtype",
                                                             "seed",
                                                             "strategy",
                                                             "mesh",
                                                             "names",
                                                             "sequence_parallel",
                                                             "save",
                                                             "save_every",
                                                             "keep_checkpoints",
                                                             "resume"};

/// An RL run's settings by field name (core/settings.hpp): the policy (`init` or `model`), the
/// task, GRPO's figures and the trainer's settings. `meshtensor rl`'s flags and `mt.rl()`'s
/// keywords; the launch (ranks, the generator's layout, the backend) stays with each front end.
class RlSettings : public Settings {
 public:
  RlSettings() : Settings(table()) {}
  /// Every field, in the order help lists them.
  static std::span<const SettingField> table();

  /// The RlConfig (trainer_ranks and generator left at their defaults for the front end to
  /// set); ParseError or InvalidArgument naming the field.
  RlConfig config() const;
  /// The trainer's settings alone (for the ranks its mesh names).
  train::TrainSettings trainer() const;
  /// The task `task`, `data`, `dictionary` and `prompt_bytes` name, loaded.
  RlTask task() const;
};

}  // namespace meshtensor::rl
