#pragma once

#include <cstdint>
#include <span>

#include <nlohmann/json.hpp>

#include <meshtensor/core/settings.hpp>
#include <meshtensor/train/trainer.hpp>

namespace meshtensor::train {

/// A training run's settings by field name, as text: the one path from the command line's
/// options and Python's keyword arguments to a TrainConfig. It owns the defaults (those of the
/// task: a language model trains LanguageDefaults, images 8 epochs of 256), the derived rules
/// (two micro-batches per pp rank, hsdp for a mesh without dim names, `stop_after` counting
/// what the run's length counts), and every field's parsing and range. Its errors name fields in
/// backquotes (`micro_batches`), which each front end gives by its own names.
class TrainSettings : public Settings {
 public:
  TrainSettings() : Settings(table()) {}
  /// Every field, in the order help lists them.
  static std::span<const SettingField> table();

  /// The config of a run whose task is (`language`) or is not a language model, with the
  /// defaults and derived rules applied; ParseError or InvalidArgument naming the field. A
  /// `steps` default (set_default) gives way to a given `epochs`.
  TrainConfig config(bool language) const;
  /// The ranks `mesh` names (the product of its sizes), or 0 when no mesh was given.
  std::int64_t mesh_ranks() const;

 private:
  void parse_length(TrainConfig& config, bool language) const;
  void parse_optimizer(TrainConfig& config, bool language) const;
  void parse_layout(TrainConfig& config) const;
  void parse_sharding(TrainConfig& config) const;
  void parse_checkpoints(TrainConfig& config) const;
};

/// Every setting of `config` by field name, with enums and dtypes as their names: the canonical
/// form a run's ranks compare, results carry ("settings") and checkpoints could record.
nlohmann::json settings_json(const TrainConfig& config);

}  // namespace meshtensor::train
