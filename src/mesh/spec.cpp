#include <algorithm>

#include <fmt/format.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/mesh/spec.hpp>

namespace meshtensor {

namespace {
std::vector<int> default_levels(const std::vector<Placement>& placements) {
  std::vector<int> levels(placements.size(), 0);
  for (std::size_t m = 0; m < placements.size(); ++m) {
    if (!placements[m].is_shard()) continue;
    for (std::size_t earlier = 0; earlier < m; ++earlier) {
      if (placements[earlier].is_shard() &&
          placements[earlier].shard_dim() == placements[m].shard_dim()) {
        ++levels[m];
      }
    }
  }
  return levels;
}
}  // namespace

PlacementSpec::PlacementSpec(std::vector<Placement> placements)
    : placements_(std::move(placements)), shard_levels_(default_levels(placements_)) {
  check_partial_mix();
}

PlacementSpec::PlacementSpec(std::vector<Placement> placements, std::vector<int> shard_levels)
    : placements_(std::move(placements)), shard_levels_(std::move(shard_levels)) {
  if (shard_levels_.size() != placements_.size()) {
    throw InvalidArgument(
        fmt::format("{} shard levels for {} placements", shard_levels_.size(), placements_.size()));
  }
  for (std::size_t m = 0; m < placements_.size(); ++m) {
    if (!placements_[m].is_shard()) shard_levels_[m] = 0;
  }
  check_partial_mix();
  // Each sharded tensor dim needs levels 0..k-1 exactly once.
  for (std::size_t m = 0; m < placements_.size(); ++m) {
    if (!placements_[m].is_shard()) continue;
    const int tensor_dim = placements_[m].shard_dim();
    std::vector<int> levels;
    for (std::size_t other = 0; other < placements_.size(); ++other) {
      if (placements_[other].is_shard() && placements_[other].shard_dim() == tensor_dim) {
        levels.push_back(shard_levels_[other]);
      }
    }
    std::sort(levels.begin(), levels.end());
    for (std::size_t i = 0; i < levels.size(); ++i) {
      if (levels[i] != static_cast<int>(i)) {
        throw InvalidArgument(fmt::format(
            "spec {}: the {} mesh dims sharding tensor dim {} need levels 0..{} once each, got "
            "[{}]",
            to_string(), levels.size(), tensor_dim, levels.size() - 1, fmt::join(levels, ",")));
      }
    }
  }
}

void PlacementSpec::check_partial_mix() const {
  // Allowed sets of Partial ops: {sum}, {avg}, {sum, avg}, {max}, {min}.
  bool seen[4] = {false, false, false, false};
  for (const Placement& placement : placements_) {
    if (placement.is_partial()) seen[static_cast<int>(placement.reduce_op())] = true;
  }
  const int kinds = seen[0] + seen[1] + seen[2] + seen[3];
  const bool has_extremum =
      seen[static_cast<int>(ReduceOp::max)] || seen[static_cast<int>(ReduceOp::min)];
  if (has_extremum && kinds > 1) {
    throw InvalidArgument(fmt::format(
        "spec {} mixes Partial kinds that do not combine; only sum and avg may be mixed",
        to_string()));
  }
}

const Placement& PlacementSpec::at(int mesh_dim) const {
  if (mesh_dim < 0 || mesh_dim >= mesh_ndim()) {
    throw InvalidArgument(
        fmt::format("mesh dim {} is out of range for spec {}", mesh_dim, to_string()));
  }
  return placements_[static_cast<std::size_t>(mesh_dim)];
}

std::vector<int> PlacementSpec::shard_mesh_dims(int tensor_dim) const {
  std::vector<int> dims;
  for (int m = 0; m < mesh_ndim(); ++m) {
    const Placement& placement = placements_[static_cast<std::size_t>(m)];
    if (placement.is_shard() && placement.shard_dim() == tensor_dim) dims.push_back(m);
  }
  std::sort(dims.begin(), dims.end(), [&](int a, int b) {
    return shard_levels_[static_cast<std::size_t>(a)] < shard_levels_[static_cast<std::size_t>(b)];
  });
  return dims;
}

bool PlacementSpec::has_default_shard_order() const {
  return shard_levels_ == default_levels(placements_);
}

std::vector<int> PlacementSpec::partial_mesh_dims() const {
  std::vector<int> dims;
  for (int m = 0; m < mesh_ndim(); ++m) {
    if (placements_[static_cast<std::size_t>(m)].is_partial()) dims.push_back(m);
  }
  return dims;
}

int PlacementSpec::max_shard_dim() const {
  int highest = -1;
  for (const Placement& placement : placements_) {
    if (placement.is_shard()) highest = std::max(highest, placement.shard_dim());
  }
  return highest;
}

void PlacementSpec::validate(const DeviceMesh& mesh, int tensor_rank) const {
  if (mesh_ndim() != mesh.ndim()) {
    throw InvalidArgument(fmt::format("spec {} has {} placements but mesh {} has {} dims",
                                      to_string(), mesh_ndim(), mesh.to_string(), mesh.ndim()));
  }
  if (max_shard_dim() >= tensor_rank) {
    throw InvalidArgument(fmt::format("spec {} shards tensor dim {}, but the tensor has rank {}",
                                      to_string(), max_shard_dim(), tensor_rank));
  }
}

std::string PlacementSpec::to_string() const {
  const bool show_levels = !has_default_shard_order();
  std::vector<std::string> parts;
  for (std::size_t m = 0; m < placements_.size(); ++m) {
    std::string part = placements_[m].to_string();
    if (show_levels && placements_[m].is_shard()) part += fmt::format("@{}", shard_levels_[m]);
    parts.push_back(std::move(part));
  }
  return fmt::format("{}", fmt::join(parts, ","));
}

}  // namespace meshtensor
