#pragma once

#include <memory>

#include <meshtensor/comm/mesh_groups.hpp>
#include <meshtensor/core/tensor.hpp>
#include <meshtensor/dtensor/redistribute.hpp>
#include <meshtensor/mesh/spec.hpp>

namespace meshtensor::dtensor {

/// A tensor sharded over a device mesh, seen from one rank: this rank's block plus the spec and
/// global shape that say where the block sits. Operations are collective (SPMD): every rank of
/// the mesh calls them with the same arguments.
class DTensor {
 public:
  /// Wraps this rank's block; throws InvalidArgument when its shape is not the block the spec
  /// gives this rank.
  DTensor(std::shared_ptr<comm::MeshGroups> groups, PlacementSpec spec, Shape global_shape,
          Tensor local);

  /// This rank's block.
  const Tensor& local() const { return local_; }
  /// The placements.
  const PlacementSpec& spec() const { return spec_; }
  /// Shape of the whole tensor.
  const Shape& global_shape() const { return global_shape_; }
  /// Element type.
  DType dtype() const { return local_.dtype(); }
  /// The mesh and its groups.
  comm::MeshGroups& groups() const { return *groups_; }
  /// The mesh and its groups, shared.
  const std::shared_ptr<comm::MeshGroups>& shared_groups() const { return groups_; }

  /// The same tensor under `spec`, moved by a planned sequence of collectives.
  DTensor redistribute(const PlacementSpec& spec, const RedistributeOptions& options = {}) const;
  /// The whole tensor on every rank (Partial dims reduced with their op).
  Tensor full_tensor(const RedistributeOptions& options = {}) const;

 private:
  std::shared_ptr<comm::MeshGroups> groups_;
  PlacementSpec spec_;
  Shape global_shape_;
  Tensor local_;
};

/// Turns `local`, a block every rank holds whole under `spec`'s Partial dims, into Partial
/// contributions: along Partial(sum) dims the member at position 0 keeps the values and the others
/// zero theirs (Partial avg/max/min keep them everywhere).
void keep_partial_sums_on_first(Tensor& local, const DeviceMesh& mesh, const PlacementSpec& spec,
                                std::int64_t rank);
/// Places `global` (the same on every rank) by `spec`: each rank keeps its block. Along
/// Partial(sum) dims the member at position 0 keeps the values and the others hold zeros; along
/// Partial(avg|max|min) dims every member keeps them.
DTensor distribute(const Tensor& global, std::shared_ptr<comm::MeshGroups> groups,
                   const PlacementSpec& spec);

/// Wraps blocks every rank already holds (see the DTensor constructor).
DTensor from_local(Tensor local, std::shared_ptr<comm::MeshGroups> groups,
                   const PlacementSpec& spec, const Shape& global_shape);

}  // namespace meshtensor::dtensor
