#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include <meshtensor/train/trainer.hpp>

namespace meshtensor::train {

/// One setting of a training run in TrainSettings' table.
struct SettingField {
  std::string_view name;   ///< the field: Python's keyword; the command line's flag is --name
  std::string_view help;   ///< what it sets, and its default
  bool is_switch = false;  ///< "true" or "false" (a flag without a value on the command line)
};

/// A training run's settings by field name, as text: the one path from the command line's
/// options and Python's keyword arguments to a TrainConfig. It owns the defaults (those of the
/// task: a language model trains LanguageDefaults, images 8 epochs of 256), the derived rules
/// (two micro-batches per pp rank, hsdp for a mesh without dim names, `stop_after` counting
/// what the run's length counts), and every field's parsing and range. Its errors name fields in
/// backquotes (`micro_batches`), which each front end gives by its own names.
class TrainSettings {
 public:
  /// Every field, in the order help lists them.
  static std::span<const SettingField> fields();
  /// True when `name` is one of fields().
  static bool has_field(std::string_view name);

  /// Gives field `name` the value `text`; InvalidArgument naming an unknown field.
  void set(std::string_view name, std::string text);
  /// True when set() gave `name`.
  bool given(std::string_view name) const;
  /// Makes `text` the default of field `name` in place of the table's (a benchmark's own step
  /// count); a `steps` default gives way to a given `epochs`.
  void set_default(std::string_view name, std::string text);

  /// The config of a run whose task is (`language`) or is not a language model, with the
  /// defaults and derived rules applied; ParseError or InvalidArgument naming the field.
  TrainConfig config(bool language) const;
  /// The ranks `mesh` names (the product of its sizes), or 0 when no mesh was given.
  std::int64_t mesh_ranks() const;

 private:
  /// The given text of `name`, or `fallback`.
  std::string text(std::string_view name, std::string_view fallback) const;
  void parse_length(TrainConfig& config, bool language) const;
  void parse_optimizer(TrainConfig& config, bool language) const;
  void parse_layout(TrainConfig& config) const;
  void parse_sharding(TrainConfig& config) const;
  void parse_checkpoints(TrainConfig& config) const;

  std::map<std::string, std::string, std::less<>> given_;
  std::map<std::string, std::string, std::less<>> defaults_;
};

/// Every setting of `config` by field name, with enums and dtypes as their names: the canonical
/// form a run's ranks compare, results carry ("settings") and checkpoints could record.
nlohmann::json settings_json(const TrainConfig& config);

}  // namespace meshtensor::train
