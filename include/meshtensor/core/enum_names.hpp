#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include <meshtensor/core/error.hpp>

namespace meshtensor {

/// One entry of an enum's name table.
template <class Enum>
struct EnumName {
  Enum value;             ///< the enumerator
  std::string_view name;  ///< its name on the command line and in output
};

/// Name of `value` in `table`; throws InvalidArgument for a value outside the table.
template <class Enum, std::size_t N>
std::string_view enum_name(const EnumName<Enum> (&table)[N], Enum value, std::string_view what) {
  for (const auto& entry : table) {
    if (entry.value == value) return entry.name;
  }
  throw InvalidArgument(fmt::format("invalid {} value {}", what, static_cast<int>(value)));
}

/// Enumerator called `text` in `table`; throws ParseError naming the token and the choices.
template <class Enum, std::size_t N>
Enum parse_enum(const EnumName<Enum> (&table)[N], std::string_view text, std::string_view what) {
  std::string choices;
  for (const auto& entry : table) {
    if (entry.name == text) return entry.value;
    choices += choices.empty() ? "" : ", ";
    choices += entry.name;
  }
  throw ParseError(fmt::format("unknown {} '{}': expected one of {}", what, text, choices));
}

}  // namespace meshtensor
