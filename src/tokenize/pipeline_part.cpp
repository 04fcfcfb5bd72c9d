#include "pipeline_part.hpp"

#include <fmt/format.h>

#include <meshtensor/core/untrusted_json.hpp>

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
