#include <vector>

#include <meshtensor/fsdp/unit_gather.hpp>

namespace meshtensor::fsdp {

namespace {

std::int64_t ranks_over(const DeviceMesh& mesh, std::span<const int> dims) {
  std::int64_t ranks = 1;
  for (const int d : dims)
    ranks *= mesh.size(d);
  return ranks;
}

/// Per unit of the group led by mesh rank `leader` over `both` (shard-major, `replicas` per
/// shard): true when every unit holds each of the `shards` shards.
bool units_hold_every_shard(const DeviceMesh& mesh, const Topology& topology,
                            std::span<const int> both, std::int64_t leader, std::int64_t shards,
                            std::int64_t replicas) {
  const std::vector<std::int64_t> members = mesh.group_ranks(leader, both);
  if (spread_of(topology, members).level != LinkLevel::network) return false;
  for (const std::vector<int>& places : unit_positions(topology, members)) {
    std::vector<bool> held(static_cast<std::size_t>(shards), false);
    for (const int position : places)
      held[static_cast<std::size_t>(position / replicas)] = true;
    for (const bool h : held) {
      if (!h) return false;
    }
  }
  return true;
}

}  // namespace

std::optional<UnitGather> plan_unit_gather(const DeviceMesh& mesh, const Topology& topology,
                                           std::span<const int> shard_dims,
                                           std::span<const int> replicate_dims, std::int64_t rank) {
  const std::int64_t shards = ranks_over(mesh, shard_dims);
  const std::int64_t replicas = ranks_over(mesh, replicate_dims);
  if (shards <= 1 || replicas <= 1 || topology.single_level()) return std::nullopt;
  std::vector<int> both(shard_dims.begin(), shard_dims.end());
  both.insert(both.end(), replicate_dims.begin(), replicate_dims.end());
  bool some_shard_group_crosses = false;
  for (std::int64_t r = 0; r < mesh.size(); ++r) {
    if (mesh.group_position(r, shard_dims) == 0 &&
        spread_of(topology, mesh.group_ranks(r, shard_dims)).level == LinkLevel::network) {
      some_shard_group_crosses = true;
    }
    if (mesh.group_position(r, both) == 0 &&
        !units_hold_every_shard(mesh, topology, both, r, shards, replicas)) {
      return std::nullopt;
    }
  }
  if (!some_shard_group_crosses) return std::nullopt;
  const std::vector<std::int64_t> members = mesh.group_ranks(rank, both);
  const auto me = static_cast<int>(mesh.group_position(rank, both));
  for (const std::vector<int>& places : unit_positions(topology, members)) {
    bool mine = false;
    for (const int position : places)
      mine = mine || position == me;
    if (!mine) continue;
    UnitGather plan;
    std::vector<bool> sent(static_cast<std::size_t>(shards), false);
    for (const int position : places) {
      const auto shard = static_cast<std::size_t>(position / replicas);
      plan.shard_of_place.push_back(sent[shard] ? -1 : static_cast<int>(shard));
      sent[shard] = true;
    }
    return plan;
  }
  return std::nullopt;
}

}  // namespace meshtensor::fsdp
