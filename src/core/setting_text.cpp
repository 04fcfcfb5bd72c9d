#include <charconv>
#include <cmath>

#include <fmt/format.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/core/setting_text.hpp>
#include <meshtensor/core/shape.hpp>

namespace meshtensor {

std::int64_t integer_setting(std::string_view name, const std::string& text, std::int64_t min,
                             std::int64_t max) {
  const std::int64_t value = parse_count(text, max, name);
  if (value < min) {
    throw ParseError(fmt::format("{}: '{}' is too small (at least {})", name, text, min));
  }
  return value;
}

double real_setting(std::string_view name, const std::string& text, double min, double max) {
  double value = 0.0;
  const char* begin = text.data();
  const char* end = begin + text.size();
  const auto [at, error] = std::from_chars(begin, end, value);
  if (text.empty() || error != std::errc{} || at != end || !std::isfinite(value)) {
    throw ParseError(fmt::format("{} '{}' is not a number", name, text));
  }
  if (value < min || value > max) {
    throw ParseError(fmt::format("{} {} is outside [{}, {}]", name, text, min, max));
  }
  return value;
}

std::uint64_t seed_setting(std::string_view name, const std::string& text) {
  return parse_unsigned(text, UINT64_MAX, name);
}

bool bool_setting(std::string_view name, const std::string& text) {
  if (text == "true" || text == "1") return true;
  if (text == "false" || text == "0") return false;
  throw ParseError(fmt::format("{} '{}' is not true or false", name, text));
}

std::vector<std::string> list_setting(std::string_view name, const std::string& text) {
  std::vector<std::string> entries;
  for (std::string_view entry : split(text, ',')) {
    if (entry.empty()) {
      throw ParseError(
          fmt::format("{} '{}' has an empty entry: expected values joined by ','", name, text));
    }
    entries.emplace_back(entry);
  }
  return entries;
}

}  // namespace meshtensor
