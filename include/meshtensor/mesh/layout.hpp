#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <meshtensor/core/shape.hpp>
#include <meshtensor/core/tensor.hpp>
#include <meshtensor/mesh/device_mesh.hpp>
#include <meshtensor/mesh/spec.hpp>

namespace meshtensor {

/// A contiguous range [offset, offset + size) of one tensor dim.
struct Chunk {
  std::int64_t offset = 0;  ///< first index
  std::int64_t size = 0;    ///< number of indices
  friend bool operator==(const Chunk&, const Chunk&) = default;
};

/// Piece `index` of `length` items split into `parts` the way torch.chunk does: every piece has
/// ceil(length / parts) items except that trailing pieces may hold fewer or none. This is the
/// one place where chunk sizes are computed.
Chunk chunk_extent(std::int64_t length, std::int64_t parts, std::int64_t index);

/// How context parallelism splits a sequence over the `degree` ranks of its group.
enum class ContextSplit {
  /// 2·degree chunks (chunk_extent); rank r holds chunks r and 2·degree−1−r, so every rank gets
  /// as much causal attention work as the others.
  head_tail,
  /// degree chunks; rank r holds chunk r (the later ranks attend over more keys).
  contiguous,
};

/// The positions of a sequence of `length` that rank `rank` of a context-parallel group of
/// `degree` holds, as ascending pieces (head-tail: two; contiguous: one). InvalidArgument naming
/// the values when a chunk would be empty (the sequence is too short for the degree).
std::vector<Chunk> context_chunks(std::int64_t length, std::int64_t degree, std::int64_t rank,
                                  ContextSplit split = ContextSplit::head_tail);

/// Whether `length` positions split over `degree` ranks by `split` leave no chunk empty.
bool context_splits(std::int64_t length, std::int64_t degree,
                    ContextSplit split = ContextSplit::head_tail);

/// The block of the global tensor one rank holds.
struct Layout {
  Shape local_shape;                        ///< shape of the local block
  std::vector<std::int64_t> global_offset;  ///< index of its first element in the global tensor
  friend bool operator==(const Layout&, const Layout&) = default;
  /// "8x4 @ [0,4]".
  std::string to_string() const;
  /// Number of elements in the block.
  std::int64_t numel() const { return local_shape.numel(); }
};

/// The part of block `a` that lies inside block `b` (same rank); zero extents where they do not
/// meet.
Layout intersect(const Layout& a, const Layout& b);

/// The elements of block `inner` as a view of `outer_tensor`, which holds block `outer`; throws
/// InvalidArgument unless `inner` lies inside `outer` and the tensor has `outer`'s shape (extra
/// trailing tensor dims are kept whole).
Tensor block_view(const Tensor& outer_tensor, const Layout& outer, const Layout& inner);

/// The largest extent any rank's block has along each tensor dim under `spec` (the first pieces
/// of torch.chunk are the largest), without visiting the ranks.
Shape max_local_shape(const DeviceMesh& mesh, const PlacementSpec& spec, const Shape& global_shape);

/// Where `rank` sits in a tensor of `global_shape` placed by `spec` on `mesh`: each sharded
/// tensor dim is split by its mesh dims in shard order (outermost first), each split applying
/// chunk_extent to the piece left by the previous one. Validates the spec.
Layout local_layout(const DeviceMesh& mesh, const PlacementSpec& spec, const Shape& global_shape,
                    std::int64_t rank);

/// View of `global` restricted to `layout` (shares storage).
Tensor local_view(const Tensor& global, const Layout& layout);

/// Mesh dims on which `spec` is not Shard: fixing a rank's coordinates on them gives the set of
/// ranks whose blocks tile the global tensor exactly once.
std::vector<int> non_shard_mesh_dims(const PlacementSpec& spec);

}  // namespace meshtensor
