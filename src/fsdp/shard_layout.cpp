#include <algorithm>

#include <fmt/format.h>

#include <meshtensor/comm/communicator.hpp>
#include <meshtensor/core/error.hpp>
#include <meshtensor/fsdp/shard_layout.hpp>

namespace meshtensor::fsdp {

ShardLayout::ShardLayout(std::vector<Shape> shapes, std::vector<int> dims, int ranks)
    : shapes_(std::move(shapes)), dims_(std::move(dims)), ranks_(ranks) {
  if (ranks_ < 1) throw InvalidArgument(fmt::format("cannot shard over {} ranks", ranks_));
  if (dims_.size() != shapes_.size()) {
    throw InvalidArgument(
        fmt::format("{} shard dims for {} parameters", dims_.size(), shapes_.size()));
  }
  for (std::size_t p = 0; p < shapes_.size(); ++p) {
    if (dims_[p] < 0 || dims_[p] >= std::max(1, shapes_[p].rank())) {
      throw InvalidArgument(fmt::format("parameter {} of shape {} has no dim {} to shard along", p,
                                        shapes_[p].to_string(), dims_[p]));
    }
    total_ += shapes_[p].numel();
  }
  counts_.assign(static_cast<std::size_t>(ranks_), 0);
  offsets_.assign(static_cast<std::size_t>(ranks_), std::vector<std::int64_t>(shapes_.size()));
  for (int r = 0; r < ranks_; ++r) {
    auto& count = counts_[static_cast<std::size_t>(r)];
    for (std::size_t p = 0; p < shapes_.size(); ++p) {
      offsets_[static_cast<std::size_t>(r)][p] = count;
      count += chunk_shape(p, r).numel();
    }
  }
}

Chunk ShardLayout::chunk(std::size_t p, int r) const {
  const Shape& shape = shapes_.at(p);
  const std::int64_t length = shape.rank() == 0 ? 1 : shape[dims_[p]];
  return chunk_extent(length, ranks_, r);
}

Shape ShardLayout::chunk_shape(std::size_t p, int r) const {
  const Shape& shape = shapes_.at(p);
  if (shape.rank() == 0) return r == 0 ? shape : Shape{0};
  std::vector<std::int64_t> dims(shape.dims().begin(), shape.dims().end());
  dims[static_cast<std::size_t>(dims_[p])] = chunk(p, r).size;
  return Shape(dims);
}

std::int64_t ShardLayout::offset_in_segment(std::size_t p, int r) const {
  return offsets_.at(static_cast<std::size_t>(r)).at(p);
}

Tensor ShardLayout::chunk_view(const Tensor& segment, std::size_t p, int r) const {
  const Shape shape = chunk_shape(p, r);
  return segment.narrow(0, offset_in_segment(p, r), shape.numel()).reshape(shape);
}

std::vector<Tensor> ShardLayout::parameter_views(const Tensor& flat) const {
  std::vector<Tensor> views;
  std::int64_t at = 0;
  for (const Shape& shape : shapes_) {
    views.push_back(flat.narrow(0, at, shape.numel()).reshape(shape));
    at += shape.numel();
  }
  return views;
}

namespace {
// The chunk of `full` (a parameter) that rank r holds, as a view.
Tensor full_chunk(const ShardLayout& layout, const Tensor& full, std::size_t p, int r) {
  if (full.shape() != layout.shape(p)) {
    throw InvalidArgument(fmt::format("parameter {}: expected shape {}, got {}", p,
                                      layout.shape(p).to_string(), full.shape().to_string()));
  }
  if (full.rank() == 0) return r == 0 ? full : full.reshape(Shape{1}).narrow(0, 0, 0);
  const Chunk c = layout.chunk(p, r);
  return full.narrow(layout.dim(p), c.offset, c.size);
}
}  // namespace

void ShardLayout::pack(std::span<const Tensor> full, Tensor flat,
                       std::span<const std::int64_t> segment_starts) const {
  if (full.size() != shapes_.size()) {
    throw InvalidArgument(
        fmt::format("pack: {} tensors for {} parameters", full.size(), shapes_.size()));
  }
  const std::vector<std::int64_t> starts =
      segment_starts.empty()
          ? comm::displacements(counts_)
          : std::vector<std::int64_t>(segment_starts.begin(), segment_starts.end());
  for (int r = 0; r < ranks_; ++r) {
    const Tensor segment =
        flat.narrow(0, starts[static_cast<std::size_t>(r)], counts_[static_cast<std::size_t>(r)]);
    for (std::size_t p = 0; p < shapes_.size(); ++p) {
      const Tensor source = full_chunk(*this, full[p], p, r);
      if (source.numel() > 0) chunk_view(segment, p, r).copy_from(source);
    }
  }
}

void ShardLayout::pack_segment(std::span<const Tensor> full, int r, Tensor segment) const {
  if (full.size() != shapes_.size()) {
    throw InvalidArgument(
        fmt::format("pack: {} tensors for {} parameters", full.size(), shapes_.size()));
  }
  if (r < 0 || r >= ranks_ || segment.numel() != counts_[static_cast<std::size_t>(r)]) {
    throw InvalidArgument(
        fmt::format("pack_segment: rank {} of {} with {} elements", r, ranks_, segment.numel()));
  }
  for (std::size_t p = 0; p < shapes_.size(); ++p) {
    const Tensor source = full_chunk(*this, full[p], p, r);
    if (source.numel() > 0) chunk_view(segment, p, r).copy_from(source);
  }
}

bool ShardLayout::chunks_contiguous() const {
  return std::all_of(dims_.begin(), dims_.end(), [](int d) { return d == 0; });
}

void ShardLayout::unpack(const Tensor& flat, std::span<const Tensor> full) const {
  if (full.size() != shapes_.size()) {
    throw InvalidArgument(
        fmt::format("unpack: {} tensors for {} parameters", full.size(), shapes_.size()));
  }
  const std::vector<std::int64_t> starts = comm::displacements(counts_);
  for (int r = 0; r < ranks_; ++r) {
    const Tensor segment =
        flat.narrow(0, starts[static_cast<std::size_t>(r)], counts_[static_cast<std::size_t>(r)]);
    for (std::size_t p = 0; p < shapes_.size(); ++p) {
      Tensor target = full_chunk(*this, full[p], p, r);
      if (target.numel() > 0) target.copy_from(chunk_view(segment, p, r));
    }
  }
}

}  // namespace meshtensor::fsdp
