#include "pipeline_part.hpp"

#include <fmt/format.h>

#include <meshtensor/core/untrusted_json.hpp>
#include <meshtensor/core/utf8.hpp>

namespace meshtensor::tokenize {

namespace {

void add_parts(const nlohmann::json& spec, const std::string& source, const char* stage,
               const char* list,
               const std::function<void(const nlohmann::json&, const std::string&)>& add,
               int depth) {
  if (!spec.is_object() || !spec.contains("type") || !spec["type"].is_string())
    throw part_error(source, stage, spec, "not an object with a \"type\"");
  const std::string type = spec["type"].get<std::string>();
  if (type == "Sequence") {
    if (depth >= 8 || !spec.contains(list) || !spec[list].is_array()) {
      throw part_error(source, stage, spec,
                       fmt::format("a Sequence needs a \"{}\" list (nested at most 8 deep)", list));
    }
    for (const nlohmann::json& part : spec[list])
      add_parts(part, source, stage, list, add, depth + 1);
    return;
  }
  try {
    add(spec, type);
  } catch (const DataError& e) {
    if (std::string_view(e.what()).starts_with(source + ": ")) throw;
    throw part_error(source, stage, spec, e.what());
  }
}

}  // namespace

DataError part_error(const std::string& source, const char* stage, const nlohmann::json& part,
                     const std::string& why) {
  return DataError(fmt::format("{}: {} {}: {}", source, stage, json_excerpt(part), why));
}

void for_each_part(const nlohmann::json& spec, const std::string& source, const char* stage,
                   const char* list,
                   const std::function<void(const nlohmann::json&, const std::string&)>& add) {
  add_parts(spec, source, stage, list, add, 0);
}

std::string string_field(const nlohmann::json& part, const char* key, const std::string& fallback) {
  if (!part.contains(key) || part[key].is_null()) return fallback;
  if (!part[key].is_string())
    throw DataError(fmt::format("\"{}\" is {}, not a string", key, json_excerpt(part[key])));
  return part[key].get<std::string>();
}

bool flag_field(const nlohmann::json& part, const char* key, bool fallback) {
  if (!part.contains(key) || part[key].is_null()) return fallback;
  if (!part[key].is_boolean()) {
    throw DataError(fmt::format("\"{}\" is {}, not true or false", key, json_excerpt(part[key])));
  }
  return part[key].get<bool>();
}

std::string character_field(const nlohmann::json& part, const char* key, const char* fallback) {
  const std::string text = string_field(part, key, fallback);
  char32_t c = 0;
  if (text.empty() || utf8_sequence(text, 0, c) != static_cast<int>(text.size()))
    throw DataError(fmt::format("its {} is not one character", key));
  return text;
}

std::string prepend_scheme(const nlohmann::json& part) {
  const std::string scheme = string_field(
      part, "prepend_scheme", flag_field(part, "add_prefix_space", true) ? "always" : "never");
  if (scheme != "always" && scheme != "first" && scheme != "never")
    throw DataError(fmt::format("prepend_scheme '{}' is not always, first or never", scheme));
  return scheme;
}

std::string replace_pattern(const nlohmann::json& part) {
  const nlohmann::json pattern = part.value("pattern", nlohmann::json());
  if (!pattern.is_object() || !pattern.contains("String") || !pattern["String"].is_string() ||
      pattern["String"].get<std::string>().empty())
    throw DataError("meshtensor replaces a non-empty String pattern only (not a Regex)");
  return pattern["String"].get<std::string>();
}

std::string replace_all(std::string_view text, std::string_view pattern,
                        std::string_view replacement) {
  std::string out;
  std::size_t at = 0;
  for (std::size_t found; (found = text.find(pattern, at)) != std::string_view::npos;
       at = found + pattern.size()) {
    out.append(text.substr(at, found - at));
    out.append(replacement);
  }
  out.append(text.substr(at));
  return out;
}

}  // namespace meshtensor::tokenize
