#pragma once

#include <map>
#include <memory>
#include <span>
#include <tuple>
#include <vector>

#include <meshtensor/comm/communicator.hpp>
#include <meshtensor/comm/two_level.hpp>
#include <meshtensor/mesh/device_mesh.hpp>

namespace meshtensor::comm {

/// Owns every communicator of one device mesh (nothing else creates groups): the group along any
/// set of mesh dims, in any major-to-minor order, made on first use and cached by its ordered
/// list of world ranks, so the same ranks in the same order always share one communicator.
class MeshGroups {
 public:
  /// `world` spans the mesh: world rank r is mesh rank r. Throws InvalidArgument when the sizes
  /// differ.
  MeshGroups(DeviceMesh mesh, std::shared_ptr<Communicator> world);

  /// The mesh.
  const DeviceMesh& mesh() const { return mesh_; }
  /// This rank's mesh rank.
  std::int64_t rank() const { return world_->rank(); }
  /// The world communicator.
  Communicator& world() { return *world_; }

  /// Communicator over `dims` (major to minor): its members are mesh.group_ranks(rank(), dims)
  /// in that order. Collective on first use of a rank list: every rank of the mesh must ask for
  /// the same dims in the same order; cached lookups communicate nothing.
  ///
  /// `channel` > 0 asks for another communicator over the same ranks, with its own queue: work
  /// on different channels of one rank list runs concurrently (e.g. the all-gathers and the
  /// reduce-scatters of a sharded model). Channel 0 of the whole mesh is the world itself.
  std::shared_ptr<Communicator> group(std::span<const int> dims,
                                      const CollectiveOptions& options = {}, int channel = 0);
  /// Where the mesh's ranks sit (indexed by mesh rank): the world communicator's topology.
  const Topology& topology() const { return *topology_; }

  /// group(dims) run in two levels (TwoLevelCommunicator): inside each host (or domain, when
  /// the group stays on one host) and across them, also when the units hold different numbers
  /// of its members. The flat group when this rank's group sits on one unit or holds one member
  /// per unit (then two levels do not apply). Collective on first use of (dims, channel,
  /// choice) like group(); its level groups are its own, made by two splits of the world, so no
  /// other user's work interleaves with theirs. The first TwoLevelChoice::by_price group on
  /// several hosts or domains measures local_costs() (collective on the world).
  std::shared_ptr<Communicator> two_level_group(std::span<const int> dims, TwoLevelChoice choice,
                                                const CollectiveOptions& options = {},
                                                int channel = 0);

  /// The members of group(dims) on this rank's unit (unit_positions' units: hosts when the
  /// group crosses the network, else domains), in group order, with its own communicator per
  /// `channel`. Collective on first use of (dims, channel) like two_level_group(): every rank of
  /// the mesh splits, also where its unit group equals another group.
  std::shared_ptr<Communicator> unit_group(std::span<const int> dims,
                                           const CollectiveOptions& options = {}, int channel = 0);

  /// True when every group along `dims` puts the same group positions on each of its units
  /// (unit_positions): their two-level ordered sums then add in the same order, so results
  /// replicated across those groups stay the same bits.
  bool splits_alike(std::span<const int> dims) const;

  /// What a collective and a copy cost here with every rank running (measure_local_costs),
  /// once measured; the cost model's defaults before.
  const LocalCosts& local_costs() const { return local_costs_; }

  /// Number of distinct communicators created so far (the world included).
  std::size_t cached_groups() const { return by_ranks_.size(); }

 private:
  DeviceMesh mesh_;
  std::shared_ptr<Communicator> world_;
  std::shared_ptr<const Topology> topology_ = std::make_shared<const Topology>();
  std::map<std::pair<std::vector<std::int64_t>, int>, std::shared_ptr<Communicator>> by_ranks_;
  std::map<std::tuple<std::vector<int>, int, int>, std::shared_ptr<Communicator>> two_level_;
  std::map<std::pair<std::vector<int>, int>, std::shared_ptr<Communicator>> unit_groups_;
  LocalCosts local_costs_;
  bool costs_measured_ = false;
};

}  // namespace meshtensor::comm
