#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>

namespace meshtensor {

/// One field of a settings table.
struct SettingField {
  std::string_view name;   ///< the field: Python's keyword; the command line's flag is --name
  std::string_view help;   ///< what it sets, and its default
  bool is_switch = false;  ///< "true" or "false" (a flag without a value on the command line)
};

/// A job's settings by field name, as text: the one path from the command line's options and
/// Python's keyword arguments to the job's config. Each job's settings type (train::TrainSettings,
/// rl::RlSettings, serve::ServeSettings) derives from it with its table of fields and parses them
/// into its config in one place: defaults, derived rules, ranges. Errors name fields in
/// backquotes (`micro_batches`), which each front end gives by its own names.
class Settings {
 public:
  /// The fields of this job, in the order help lists them.
  std::span<const SettingField> fields() const { return fields_; }
  /// True when `name` is one of fields().
  bool has_field(std::string_view name) const;
  /// Gives field `name` the value `text`; InvalidArgument naming an unknown field.
  void set(std::string_view name, std::string text);
  /// True when set() gave `name`.
  bool given(std::string_view name) const;
  /// Makes `text` the default of field `name` in place of the job's own (a benchmark's step
  /// count, rl's learning rate).
  void set_default(std::string_view name, std::string text);

 protected:
  explicit Settings(std::span<const SettingField> fields) : fields_(fields) {}
  /// The given text of `name`, else a default set_default() gave, else `fallback`.
  std::string text(std::string_view name, std::string_view fallback) const;
  /// text() as an integer in [min, max], a number in [min, max], true or false; ParseError
  /// naming the field.
  std::int64_t integer(std::string_view name, std::string_view fallback, std::int64_t min,
                       std::int64_t max) const;
  double real(std::string_view name, std::string_view fallback, double min, double max) const;
  bool flag(std::string_view name, bool fallback) const;

 private:
  std::span<const SettingField> fields_;
  std::map<std::string, std::string, std::less<>> given_;
  std::map<std::string, std::string, std::less<>> defaults_;
};

/// `name` in backquotes, as the library's messages name fields.
std::string field_name(std::string_view name);

}  // namespace meshtensor
