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

}  // namespace meshtensor
