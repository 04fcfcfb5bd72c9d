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

/// `text` with every occurrence of `pattern` (not empty) replaced by `replacement`.
std::string replace_all(std::string_view text, std::string_view pattern,
                        std::string_view replacement);

}  // namespace meshtensor::tokenize
