#pragma once

// Parsing JSON a user hands in (checkpoint indexes, safetensors headers, HTTP request bodies): the
// nesting depth is bounded before the parser sees the text, and error messages quote a bounded
// excerpt of a bad value, never the whole of it.

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace meshtensor {

/// Deepest nesting of arrays and objects such JSON may have (checkpoints use 4).
inline constexpr int kMaxJsonDepth = 64;

/// Parses `text` (the contents of `file`): a discarded value when it is not valid JSON;
/// DataError naming the file when it nests deeper than kMaxJsonDepth, ResourceError when it
/// would need more memory than the process has. `callback` is nlohmann's parser callback (may
/// be empty).
nlohmann::json parse_untrusted_json(std::string_view text, const std::string& file,
                                    const nlohmann::json::parser_callback_t& callback = nullptr);

/// A short description of `value` for an error message: scalars as JSON cut to about 40
/// characters, arrays and objects by kind and size.
std::string json_excerpt(const nlohmann::json& value);

}  // namespace meshtensor
