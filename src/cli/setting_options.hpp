#pragma once

#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <CLI/CLI.hpp>

#include <meshtensor/core/settings.hpp>

namespace meshtensor::cli {

/// Command-line options for fields of a settings table (train::TrainSettings): --field-name for
/// each field (a flag for a switch), with the table's help in flag names. The command line maps
/// its names onto the fields here and nowhere else.
class SettingOptions {
 public:
  /// Registers the fields of `fields` named in `names` on `command`; `help` replaces the
  /// table's text of some (a benchmark's own defaults).
  void add_to(CLI::App& command, std::span<const SettingField> fields,
              const std::vector<std::string_view>& names,
              const std::map<std::string_view, std::string>& help = {});
  /// Registers every field of `fields`, in the table's order.
  void add_all(CLI::App& command, std::span<const SettingField> fields);
  /// True when the option of field `name` was given.
  bool given(std::string_view name) const;
  /// The option of field `name` (registered by add_to).
  CLI::Option* option(std::string_view name) const { return options_.find(name)->second; }
  /// The text given for field `name` (empty when not given).
  std::string value(std::string_view name) const;
  /// Sets every field given on `settings`.
  void apply_to(Settings& settings) const;

 private:
  std::map<std::string, std::string, std::less<>> values_;
  std::map<std::string, bool, std::less<>> switches_;
  std::map<std::string, CLI::Option*, std::less<>> options_;
};

}  // namespace meshtensor::cli
