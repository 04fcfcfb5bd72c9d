#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <meshtensor/mesh/device_mesh.hpp>
#include <meshtensor/mesh/placement.hpp>
#include <meshtensor/mesh/spec.hpp>

namespace meshtensor {

/// Parses mesh sizes "2x2x2" and optional names "dp,fsdp,tp" (empty: unnamed). Throws
/// ParseError naming the bad token and what was expected.
DeviceMesh parse_mesh(std::string_view sizes, std::string_view names = {});

/// Parses comma-separated dim names, as written (no trimming: DeviceMesh refuses a name that is
/// not an identifier, " tp" included).
std::vector<std::string> parse_dim_names(std::string_view text);

/// Parses one placement: "S<dim>", "R", "P" (= P(sum)), "P(sum|avg|max|min)".
Placement parse_placement(std::string_view token);

/// Parses a comma-separated spec, e.g. "S0,R,P(avg)". A non-default shard order is written with
/// levels on every Shard: "S0@1,S0@0" (mesh dim 1 splits tensor dim 0 first). Spaces around
/// tokens are ignored.
PlacementSpec parse_spec(std::string_view text);

}  // namespace meshtensor
