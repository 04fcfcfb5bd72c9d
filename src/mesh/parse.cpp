#include <fmt/format.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/core/shape.hpp>
#include <meshtensor/mesh/parse.hpp>

namespace meshtensor {

namespace {
constexpr int kMaxShardDim = 63;

std::string_view trim(std::string_view text) {
  const auto is_space = [](char c) { return c == ' ' || c == '\t'; };
  while (!text.empty() && is_space(text.front()))
    text.remove_prefix(1);
  while (!text.empty() && is_space(text.back()))
    text.remove_suffix(1);
  return text;
}

// Runs a constructor that validates semantics and reports its complaint (which already names
// the offending value) as a parse error.
template <class Build>
auto rethrow_as_parse_error(Build build) {
  try {
    return build();
  } catch (const InvalidArgument& error) {
    throw ParseError(error.what());
  }
}

// A placement token and its optional "@level" suffix.
struct PlacementToken {
  Placement placement;
  int level = -1;  // -1: none given
};

PlacementToken parse_placement_token(std::string_view token) {
  const std::string_view text = trim(token);
  constexpr const char* kExpected = "expected S<dim>, R, P, or P(sum|avg|max|min)";
  if (text.empty()) throw ParseError(fmt::format("empty placement: {}", kExpected));
  if (text == "R") return {Placement::replicate()};
  if (text == "P") return {Placement::partial(ReduceOp::sum)};
  if (text.size() > 3 && text.substr(0, 2) == "P(" && text.back() == ')') {
    const std::string_view op = text.substr(2, text.size() - 3);
    try {
      return {Placement::partial(parse_reduce_op(op))};
    } catch (const ParseError&) {
      throw ParseError(
          fmt::format("placement '{}' has unknown reduce op '{}': expected sum, avg, "
                      "max or min",
                      text, op));
    }
  }
  if (text[0] == 'S') {
    std::string_view dim = text.substr(1);
    int level = -1;
    if (const std::size_t at = dim.find('@'); at != std::string_view::npos) {
      level = static_cast<int>(parse_count(dim.substr(at + 1), kMaxShardDim,
                                           fmt::format("shard level of placement '{}'", text)));
      dim = dim.substr(0, at);
    }
    const auto tensor_dim =
        static_cast<int>(parse_count(dim, kMaxShardDim, fmt::format("placement '{}'", text)));
    return {Placement::shard(tensor_dim), level};
  }
  throw ParseError(fmt::format("unknown placement '{}': {}", text, kExpected));
}
}  // namespace

std::vector<std::string> parse_dim_names(std::string_view text) {
  // Taken as written: DeviceMesh refuses a name that is not an identifier (" tp" included).
  std::vector<std::string> names;
  for (std::string_view field : split(text, ','))
    names.emplace_back(field);
  return names;
}

DeviceMesh parse_mesh(std::string_view sizes, std::string_view names) {
  if (sizes.empty()) throw ParseError("empty mesh: expected sizes joined by 'x', e.g. 2x2x2");
  std::vector<std::int64_t> dims;
  for (std::string_view field : split(sizes, 'x')) {
    if (field.empty()) {
      throw ParseError(
          fmt::format("mesh '{}' has an empty size: expected sizes joined by 'x', "
                      "e.g. 2x4",
                      sizes));
    }
    dims.push_back(parse_count(field, kMaxMeshRanks, fmt::format("mesh '{}'", sizes)));
  }
  std::vector<std::string> dim_names;
  if (!names.empty()) dim_names = parse_dim_names(names);
  return rethrow_as_parse_error([&] { return DeviceMesh(std::move(dims), std::move(dim_names)); });
}

Placement parse_placement(std::string_view token) {
  const PlacementToken parsed = parse_placement_token(token);
  if (parsed.level >= 0) {
    throw ParseError(
        fmt::format("placement '{}': a shard level '@k' belongs in a whole spec", token));
  }
  return parsed.placement;
}

PlacementSpec parse_spec(std::string_view text) {
  if (trim(text).empty())
    throw ParseError("empty spec: expected placements joined by ',', e.g. S0,R,P");
  std::vector<Placement> placements;
  std::vector<int> levels;
  bool any_level = false;
  bool any_shard_without_level = false;
  for (std::string_view field : split(text, ',')) {
    const PlacementToken token = parse_placement_token(field);
    if (token.placement.is_shard()) {
      any_level = any_level || token.level >= 0;
      any_shard_without_level = any_shard_without_level || token.level < 0;
    }
    placements.push_back(token.placement);
    levels.push_back(std::max(token.level, 0));
  }
  if (placements.size() > static_cast<std::size_t>(kMaxMeshDims)) {
    throw ParseError(fmt::format("spec '{}' has {} placements; meshes have at most {} dims", text,
                                 placements.size(), kMaxMeshDims));
  }
  if (any_level && any_shard_without_level) {
    throw ParseError(
        fmt::format("spec '{}' gives a shard level '@k' to some Shard placements but not all: give "
                    "every Shard a "
                    "level or none",
                    text));
  }
  return rethrow_as_parse_error([&] {
    return any_level ? PlacementSpec(std::move(placements), std::move(levels))
                     : PlacementSpec(std::move(placements));
  });
}

}  // namespace meshtensor
