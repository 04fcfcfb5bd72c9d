#pragma once

#include <random>

#include <meshtensor/core/shape.hpp>
#include <meshtensor/mesh/device_mesh.hpp>
#include <meshtensor/mesh/spec.hpp>

namespace meshtensor::testing {

/// A mesh, a pair of specs on it and a tensor shape.
struct RandomCase {
  DeviceMesh mesh;
  PlacementSpec from;
  PlacementSpec to;
  Shape shape;
};

/// A random spec: Shard (random tensor dim and shard order), Replicate or Partial (one kind of
/// Partial per spec, sometimes sum mixed with avg).
inline PlacementSpec random_spec(std::mt19937_64& random, int mesh_ndim, int tensor_rank) {
  std::vector<Placement> placements;
  const int partial_kind = static_cast<int>(random() % 4);  // sum/avg mix, max, min, sum
  for (int m = 0; m < mesh_ndim; ++m) {
    switch (random() % 3) {
      case 0:
        placements.push_back(Placement::shard(static_cast<int>(random() % tensor_rank)));
        break;
      case 1:
        placements.push_back(Placement::replicate());
        break;
      default: {
        ReduceOp op = ReduceOp::sum;
        if (partial_kind == 0) op = random() % 2 ? ReduceOp::avg : ReduceOp::sum;
        if (partial_kind == 1) op = ReduceOp::max;
        if (partial_kind == 2) op = ReduceOp::min;
        placements.push_back(Placement::partial(op));
      }
    }
  }
  // A random shard order: shuffle the levels of each tensor dim's shard dims.
  std::vector<int> levels(static_cast<std::size_t>(mesh_ndim), 0);
  for (int t = 0; t < tensor_rank; ++t) {
    std::vector<int> dims;
    for (int m = 0; m < mesh_ndim; ++m) {
      if (placements[static_cast<std::size_t>(m)].is_shard() &&
          placements[static_cast<std::size_t>(m)].shard_dim() == t) {
        dims.push_back(m);
      }
    }
    std::shuffle(dims.begin(), dims.end(), random);
    for (std::size_t level = 0; level < dims.size(); ++level)
      levels[static_cast<std::size_t>(dims[level])] = static_cast<int>(level);
  }
  return PlacementSpec(std::move(placements), std::move(levels));
}

/// A random case: 1-D to `max_mesh_dims`-D mesh with sizes 1..3 (at most `max_ranks` ranks),
/// tensor rank 1..3 with extents 1..9 (often not divisible by the mesh).
inline RandomCase random_case(std::mt19937_64& random, int max_mesh_dims, std::int64_t max_ranks) {
  while (true) {
    const int ndim = 1 + static_cast<int>(random() % static_cast<unsigned>(max_mesh_dims));
    std::vector<std::int64_t> sizes;
    std::int64_t ranks = 1;
    for (int m = 0; m < ndim; ++m) {
      sizes.push_back(1 + static_cast<std::int64_t>(random() % 3));
      ranks *= sizes.back();
    }
    if (ranks > max_ranks) continue;
    const int tensor_rank = 1 + static_cast<int>(random() % 3);
    std::vector<std::int64_t> dims;
    for (int t = 0; t < tensor_rank; ++t)
      dims.push_back(1 + static_cast<std::int64_t>(random() % 9));
    return {DeviceMesh(sizes), random_spec(random, ndim, tensor_rank),
            random_spec(random, ndim, tensor_rank), Shape(dims)};
  }
}

}  // namespace meshtensor::testing
