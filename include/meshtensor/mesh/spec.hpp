#pragma once

#include <string>
#include <vector>

#include <meshtensor/mesh/device_mesh.hpp>
#include <meshtensor/mesh/placement.hpp>

namespace meshtensor {

/// One placement per mesh dim, plus the order in which mesh dims split a tensor dim that several
/// of them shard. By default the lower mesh dim splits first (outermost), as in DTensor.
///
/// Partial placements may mix only `sum` and `avg` (the avg dims divide once, at the end, by the
/// product of their sizes); any other mix is rejected.
class PlacementSpec {
 public:
  /// Spec with the default shard order. Throws InvalidArgument for a forbidden Partial mix.
  explicit PlacementSpec(std::vector<Placement> placements);
  /// Spec with explicit shard levels: `shard_levels[m]` is the nesting level of mesh dim m among
  /// the mesh dims sharding the same tensor dim (0 = outermost; ignored for non-Shard dims). For
  /// each tensor dim the levels must be 0..k-1 in some order.
  PlacementSpec(std::vector<Placement> placements, std::vector<int> shard_levels);

  /// Placements, one per mesh dim.
  const std::vector<Placement>& placements() const { return placements_; }
  /// Placement of mesh dim `mesh_dim` (checked).
  const Placement& at(int mesh_dim) const;
  /// Number of mesh dims the spec covers.
  int mesh_ndim() const { return static_cast<int>(placements_.size()); }
  /// Nesting level of each mesh dim (0 for non-Shard dims).
  const std::vector<int>& shard_levels() const { return shard_levels_; }

  /// Mesh dims that shard `tensor_dim`, outermost split first.
  std::vector<int> shard_mesh_dims(int tensor_dim) const;
  /// True when every sharded tensor dim splits in ascending mesh-dim order.
  bool has_default_shard_order() const;
  /// Mesh dims with a Partial placement, ascending.
  std::vector<int> partial_mesh_dims() const;
  /// Highest tensor dim any Shard names, or -1.
  int max_shard_dim() const;

  /// Throws InvalidArgument naming the spec when it does not fit `mesh` (placement count) or a
  /// tensor of rank `tensor_rank` (shard dims).
  void validate(const DeviceMesh& mesh, int tensor_rank) const;

  /// "S0,R,P(avg)"; a non-default shard order shows as "S0@1,S0@0".
  std::string to_string() const;

  friend bool operator==(const PlacementSpec&, const PlacementSpec&) = default;

 private:
  void check_partial_mix() const;

  std::vector<Placement> placements_;
  std::vector<int> shard_levels_;
};

}  // namespace meshtensor
