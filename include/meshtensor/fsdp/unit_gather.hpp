#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include <meshtensor/mesh/device_mesh.hpp>
#include <meshtensor/mesh/topology.hpp>

namespace meshtensor::fsdp {

/// HSDP on several hosts: gathering a group's parameters from the replicas on this rank's host.
/// Every replica holds the same bits of its shard, so where each host holds every shard among
/// the members of its group over the shard and replicate dims, a gather inside the host gives
/// the bits of the gather over the shard group while nothing crosses the network.
struct UnitGather {
  /// Per member of this rank's unit group (MeshGroups::unit_group over the shard and replicate
  /// dims, in its order): the shard it sends, or -1 when another member sends that shard (the
  /// first member holding a shard sends it). The senders' shards ascend: 0, 1, ..., each once.
  std::vector<int> shard_of_place;
};

/// The unit gather of mesh rank `rank` over the group of `shard_dims` then `replicate_dims`
/// (shard-major), or nullopt unless it applies to every rank of the mesh: some shard group
/// crosses the network (else its own gather stays inside a host) and every group over both dims
/// holds every shard on each host it occupies. The same answer on every rank.
std::optional<UnitGather> plan_unit_gather(const DeviceMesh& mesh, const Topology& topology,
                                           std::span<const int> shard_dims,
                                           std::span<const int> replicate_dims, std::int64_t rank);

}  // namespace meshtensor::fsdp
