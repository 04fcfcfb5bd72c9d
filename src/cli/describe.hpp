#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include <meshtensor/core/dtype.hpp>
#include <meshtensor/core/shape.hpp>
#include <meshtensor/mesh/device_mesh.hpp>
#include <meshtensor/mesh/spec.hpp>
#include <meshtensor/plan/plan.hpp>

namespace meshtensor::cli {

/// A parsed redistribute request: what `plan` and `check` take.
using Transition = plan::Redistribution;

/// Ranks whose blocks are listed unless every rank is asked for: past it, a mesh's table would
/// be larger than anyone reads (a 1024x1024 mesh: a million rows).
inline constexpr std::int64_t kListedRanks = 4096;

/// Human-readable table: the transition and each rank's block under both specs (the first
/// kListedRanks ranks unless `all_ranks`, then a line saying how many more there are).
std::string describe_layouts(const Transition& transition, bool all_ranks = false);

/// The same as JSON: "ranks" lists the same ranks, "ranks_total" counts them all.
nlohmann::json layouts_json(const Transition& transition, bool all_ranks = false);

}  // namespace meshtensor::cli
