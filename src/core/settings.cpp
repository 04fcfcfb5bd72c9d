#include <algorithm>

#include <fmt/format.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/core/setting_text.hpp>
#include <meshtensor/core/settings.hpp>

namespace meshtensor {

std::string field_name(std::string_view name) {
  return fmt::format("`{}`", name);
}

bool Settings::has_field(std::string_view name) const {
  return std::ranges::any_of(fields_, [&](const SettingField& f) { return f.name == name; });
}

void Settings::set(std::string_view name, std::string text) {
  if (!has_field(name)) throw InvalidArgument(fmt::format("unknown setting '{}'", name));
  given_.insert_or_assign(std::string(name), std::move(text));
}

bool Settings::given(std::string_view name) const {
  return given_.contains(name);
}

void Settings::set_default(std::string_view name, std::string text) {
  if (!has_field(name)) throw InvalidArgument(fmt::format("unknown setting '{}'", name));
  defaults_.insert_or_assign(std::string(name), std::move(text));
}

std::string Settings::text(std::string_view name, std::string_view fallback) const {
  if (const auto found = given_.find(name); found != given_.end()) return found->second;
  if (const auto found = defaults_.find(name); found != defaults_.end()) return found->second;
  return std::string(fallback);
}

std::int64_t Settings::integer(std::string_view name, std::string_view fallback, std::int64_t min,
                               std::int64_t max) const {
  return integer_setting(field_name(name), text(name, fallback), min, max);
}

double Settings::real(std::string_view name, std::string_view fallback, double min,
                      double max) const {
  return real_setting(field_name(name), text(name, fallback), min, max);
}

bool Settings::flag(std::string_view name, bool fallback) const {
  return bool_setting(field_name(name), text(name, fallback ? "true" : "false"));
}

}  // namespace meshtensor
