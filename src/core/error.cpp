#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <meshtensor/core/error.hpp>

namespace meshtensor {

std::string list_excerpt(std::span<const std::int64_t> values, std::size_t shown) {
  std::string text =
      fmt::format("{}", fmt::join(values.first(std::min(shown, values.size())), ","));
  if (values.size() > shown) text += fmt::format(", ... and {} more", values.size() - shown);
  return text;
}

std::string with_setting_names(std::string_view message,
                               const std::function<std::string(std::string_view)>& name_of) {
  std::string out;
  std::size_t at = 0;
  while (at < message.size()) {
    const std::size_t open = message.find('`', at);
    const std::size_t close = open == std::string_view::npos ? open : message.find('`', open + 1);
    if (close == std::string_view::npos) break;
    const std::string_view name = message.substr(open + 1, close - open - 1);
    const bool field = !name.empty() && std::all_of(name.begin(), name.end(), [](char c) {
      return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
    });
    out.append(message.substr(at, open - at));
    out += field ? name_of(name) : std::string(message.substr(open, close - open + 1));
    at = close + 1;
  }
  out.append(message.substr(std::min(at, message.size())));
  return out;
}

}  // namespace meshtensor
