#include <algorithm>

#include <fmt/format.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/mesh/layout.hpp>

namespace meshtensor {

Chunk chunk_extent(std::int64_t length, std::int64_t parts, std::int64_t index) {
  if (length < 0 || parts < 1 || index < 0 || index >= parts) {
    throw InvalidArgument(
        fmt::format("chunk_extent(length={}, parts={}, index={}) needs length >= 0, "
                    "parts >= 1 and 0 <= index < parts",
                    length, parts, index));
  }
  const std::int64_t chunk = (length + parts - 1) / parts;
  const std::int64_t begin = std::min(length, chunk * index);
  const std::int64_t end = std::min(length, begin + chunk);
  return {begin, end - begin};
}

namespace {

std::int64_t context_parts(std::int64_t degree, ContextSplit split) {
  return split == ContextSplit::head_tail ? 2 * degree : degree;
}

}  // namespace

bool context_splits(std::int64_t length, std::int64_t degree, ContextSplit split) {
  if (degree < 1 || length < 1) return false;
  const std::int64_t parts = context_parts(degree, split);
  return chunk_extent(length, parts, parts - 1).size > 0;
}

std::vector<Chunk> context_chunks(std::int64_t length, std::int64_t degree, std::int64_t rank,
                                  ContextSplit split) {
  if (degree < 1 || rank < 0 || rank >= degree) {
    throw InvalidArgument(fmt::format(
        "context parallelism: rank {} is not within a group of {} ranks", rank, degree));
  }
  const std::int64_t parts = context_parts(degree, split);
  if (!context_splits(length, degree, split)) {
    const std::int64_t chunk = length > 0 ? (length + parts - 1) / parts : 0;
    throw InvalidArgument(fmt::format(
        "context parallelism: a sequence of {} positions does not split over cp {} ({} chunks "
        "of {} leave chunk {} empty)",
        length, degree, parts, chunk, parts - 1));
  }
  if (split == ContextSplit::contiguous) return {chunk_extent(length, parts, rank)};
  return {chunk_extent(length, parts, rank), chunk_extent(length, parts, parts - 1 - rank)};
}

std::string Layout::to_string() const {
  return fmt::format("{} @ [{}]", local_shape.to_string(), fmt::join(global_offset, ","));
}

Layout local_layout(const DeviceMesh& mesh, const PlacementSpec& spec, const Shape& global_shape,
                    std::int64_t rank) {
  spec.validate(mesh, global_shape.rank());
  const std::vector<std::int64_t> coordinates = mesh.coordinates(rank);
  std::vector<std::int64_t> sizes = global_shape.dims();
  std::vector<std::int64_t> offsets(sizes.size(), 0);
  for (int tensor_dim = 0; tensor_dim < global_shape.rank(); ++tensor_dim) {
    const auto t = static_cast<std::size_t>(tensor_dim);
    for (int mesh_dim : spec.shard_mesh_dims(tensor_dim)) {
      const auto m = static_cast<std::size_t>(mesh_dim);
      const Chunk piece = chunk_extent(sizes[t], mesh.sizes()[m], coordinates[m]);
      offsets[t] += piece.offset;
      sizes[t] = piece.size;
    }
  }
  return {Shape(std::move(sizes)), std::move(offsets)};
}

Tensor local_view(const Tensor& global, const Layout& layout) {
  if (global.rank() != layout.local_shape.rank()) {
    throw InvalidArgument(fmt::format("layout {} has rank {}, the tensor {} has rank {}",
                                      layout.to_string(), layout.local_shape.rank(),
                                      global.shape().to_string(), global.rank()));
  }
  Tensor view = global;
  for (int dim = 0; dim < global.rank(); ++dim) {
    view = view.narrow(dim, layout.global_offset[static_cast<std::size_t>(dim)],
                       layout.local_shape[dim]);
  }
  return view;
}

Layout intersect(const Layout& a, const Layout& b) {
  if (a.local_shape.rank() != b.local_shape.rank()) {
    throw InvalidArgument(fmt::format("cannot intersect blocks {} and {} of different rank",
                                      a.to_string(), b.to_string()));
  }
  std::vector<std::int64_t> sizes(a.global_offset.size());
  std::vector<std::int64_t> offsets(a.global_offset.size());
  for (std::size_t d = 0; d < sizes.size(); ++d) {
    const int dim = static_cast<int>(d);
    const std::int64_t begin = std::max(a.global_offset[d], b.global_offset[d]);
    const std::int64_t end =
        std::min(a.global_offset[d] + a.local_shape[dim], b.global_offset[d] + b.local_shape[dim]);
    offsets[d] = begin;
    sizes[d] = std::max<std::int64_t>(0, end - begin);
  }
  return {Shape(std::move(sizes)), std::move(offsets)};
}

Tensor block_view(const Tensor& outer_tensor, const Layout& outer, const Layout& inner) {
  const int rank = outer.local_shape.rank();
  if (inner.local_shape.rank() != rank || outer_tensor.rank() < rank) {
    throw InvalidArgument(fmt::format("block {} is not a block of a tensor holding {}",
                                      inner.to_string(), outer.to_string()));
  }
  Tensor view = outer_tensor;
  if (inner.numel() == 0) {  // an empty piece may sit anywhere: nothing to share
    std::vector<std::int64_t> dims = inner.local_shape.dims();
    for (int dim = rank; dim < outer_tensor.rank(); ++dim)
      dims.push_back(outer_tensor.shape()[dim]);
    return Tensor(Shape(std::move(dims)), outer_tensor.dtype());
  }
  for (int dim = 0; dim < rank; ++dim) {
    const auto d = static_cast<std::size_t>(dim);
    const std::int64_t start = inner.global_offset[d] - outer.global_offset[d];
    const std::int64_t length = inner.local_shape[dim];
    if (outer_tensor.shape()[dim] != outer.local_shape[dim] || start < 0 ||
        (length > 0 && start + length > outer.local_shape[dim])) {
      throw InvalidArgument(fmt::format("block {} does not lie inside block {} (tensor {})",
                                        inner.to_string(), outer.to_string(),
                                        outer_tensor.shape().to_string()));
    }
    view = view.narrow(dim, start, length);
  }
  return view;
}

Shape max_local_shape(const DeviceMesh& mesh, const PlacementSpec& spec,
                      const Shape& global_shape) {
  spec.validate(mesh, global_shape.rank());
  std::vector<std::int64_t> sizes = global_shape.dims();
  for (int tensor_dim = 0; tensor_dim < global_shape.rank(); ++tensor_dim) {
    for (int mesh_dim : spec.shard_mesh_dims(tensor_dim)) {
      auto& size = sizes[static_cast<std::size_t>(tensor_dim)];
      size = chunk_extent(size, mesh.size(mesh_dim), 0).size;
    }
  }
  return Shape(std::move(sizes));
}

std::vector<int> non_shard_mesh_dims(const PlacementSpec& spec) {
  std::vector<int> dims;
  for (int m = 0; m < spec.mesh_ndim(); ++m) {
    if (!spec.at(m).is_shard()) dims.push_back(m);
  }
  return dims;
}

}  // namespace meshtensor
