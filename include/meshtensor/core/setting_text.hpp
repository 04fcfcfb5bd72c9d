#pragma once

// Settings given as text (a command line's option values, a front end's keyword arguments turned
// into text) are parsed here, strictly: no empty value taken as 0, no wrapping of "-1" or of
// values past 2^64. Errors are ParseErrors that start with `name` (a backquoted field name in
// the library, a flag on the command line) and quote the text.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace meshtensor {

/// An integer in [min, max]: digits only.
std::int64_t integer_setting(std::string_view name, const std::string& text, std::int64_t min,
                             std::int64_t max);

/// A finite decimal number in [min, max] ("1e-3", "0.5").
double real_setting(std::string_view name, const std::string& text, double min, double max);

/// A seed: any unsigned 64-bit integer, digits only.
std::uint64_t seed_setting(std::string_view name, const std::string& text);

/// "true" or "false" (also "1" and "0").
bool bool_setting(std::string_view name, const std::string& text);

/// A comma-separated list of non-empty entries.
std::vector<std::string> list_setting(std::string_view name, const std::string& text);

}  // namespace meshtensor
