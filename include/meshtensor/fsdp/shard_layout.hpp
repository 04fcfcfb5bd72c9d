#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include <meshtensor/core/shape.hpp>
#include <meshtensor/core/tensor.hpp>
#include <meshtensor/mesh/layout.hpp>

namespace meshtensor::fsdp {

/// How the parameters of one group are cut into shards and laid out in the flat buffers that
/// move them with one collective. Parameter p is split along its tensor dim dims[p] into
/// `ranks` chunks exactly as torch.chunk does (chunk_extent: uneven sizes, trailing chunks may
/// be empty). Rank r's *segment* holds chunk r of every parameter, in parameter order, each
/// row-major; a *rank-major* buffer is the segments of ranks 0, 1, ... back to back, which is
/// what an all-gather produces and what a reduce-scatter consumes.
class ShardLayout {
 public:
  /// The layout of parameters of `shapes`, parameter p split along dims[p] over `ranks`.
  /// InvalidArgument naming the parameter when a dim is out of range or the sizes disagree.
  ShardLayout(std::vector<Shape> shapes, std::vector<int> dims, int ranks);

  /// Number of ranks the parameters are split over.
  int ranks() const { return ranks_; }
  /// Number of parameters.
  std::size_t parameters() const { return shapes_.size(); }
  /// Elements in each rank's segment.
  const std::vector<std::int64_t>& counts() const { return counts_; }
  /// Elements of every parameter together.
  std::int64_t total() const { return total_; }
  /// The tensor dim parameter p is split along.
  int dim(std::size_t p) const { return dims_[p]; }
  /// The global shape of parameter p.
  const Shape& shape(std::size_t p) const { return shapes_[p]; }
  /// The part of parameter p's split dim rank r holds.
  Chunk chunk(std::size_t p, int r) const;
  /// The shape of rank r's chunk of parameter p.
  Shape chunk_shape(std::size_t p, int r) const;
  /// Where parameter p's chunk starts inside rank r's segment.
  std::int64_t offset_in_segment(std::size_t p, int r) const;

  /// Rank r's chunk of parameter p as a view into `segment` (rank r's segment, any dtype).
  Tensor chunk_view(const Tensor& segment, std::size_t p, int r) const;

  /// Each parameter as a view of `flat`, which holds the whole parameters back to back in
  /// parameter order (the unsharded layout of gradient sums), any dtype.
  std::vector<Tensor> parameter_views(const Tensor& flat) const;

  /// Writes chunk r of every tensor of `full` (parameter shapes, one dtype) into rank r's segment
  /// of `flat` (contiguous, same dtype), where segment r starts at `segment_starts[r]`
  /// (rank-major when empty).
  void pack(std::span<const Tensor> full, Tensor flat,
            std::span<const std::int64_t> segment_starts = {}) const;
  /// Writes chunk r of every tensor of `full` into `segment` (rank r's segment alone).
  void pack_segment(std::span<const Tensor> full, int r, Tensor segment) const;
  /// Whether every parameter's chunks lie back to back in rank order inside the parameter's
  /// flat elements (each split along its first dim), so a parameter-order buffer reduce-scatters
  /// one parameter at a time without packing.
  bool chunks_contiguous() const;
  /// The inverse of pack(): every segment of the rank-major `flat` into the tensors of `full`.
  void unpack(const Tensor& flat, std::span<const Tensor> full) const;

 private:
  std::vector<Shape> shapes_;
  std::vector<int> dims_;
  int ranks_;
  std::vector<std::int64_t> counts_;
  std::vector<std::vector<std::int64_t>> offsets_;  // [rank][parameter] inside the segment
  std::int64_t total_ = 0;
};

}  // namespace meshtensor::fsdp
