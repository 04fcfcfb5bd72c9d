#pragma once

#include <functional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include <meshtensor/core/error.hpp>

namespace meshtensor::tokenize {

/// The DataError of a part of a tokenizer.json's pipeline: "<source>: <stage> <part>: <why>".
DataError part_error(const std::string& source, const char* stage, const nlohmann::json& part,
                     const std::string& why);

/// Calls `add(part, type)` with each part of a pipeline stage (`stage`: "normalizer", ...) in
/// order: `spec` itself, or the parts of a Sequence under `list`, nested at most 8 deep. Each
/// must be an object with a string "type". A DataError `add` throws without naming the file is
/// given the file, the stage and the part.
void for_each_part(const nlohmann::json& spec, const std::string& source, const char* stage,
                   const char* list,
                   const std::function<void(const nlohmann::json&, const std::string&)>& add);

/// The string field `key` of a part (`fallback` when absent or null); DataError when it is not a
/// string.
std::string string_field(const nlohmann::json& part, const char* key, const std::string& fallback);

/// The true-or-false field `key` of a part (`fallback` when absent or null); DataError when it is
/// neither.
bool flag_field(const nlohmann::json& part, const char* key, bool fallback);

/// The field `key` of a part that holds one character (`fallback` when absent or null).
std::string character_field(const nlohmann::json& part, const char* key, const char* fallback);

/// A Metaspace's prepend_scheme: "always", "first" or "never" (from the older add_prefix_space
/// when absent: true is "always").
std::string prepend_scheme(const nlohmann::json& part);

/// The pattern of a Replace: a non-empty String (DataError for a Regex).
std::string replace_pattern(const nlohmann::json& part);

/// `text` with every occurrence of `pattern` (not empty) replaced by `replacement`.
std::string replace_all(std::string_view text, std::string_view pattern,
                        std::string_view replacement);

}  // namespace meshtensor::tokenize
