#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/cp/context_parallel.hpp>

namespace meshtensor::cp {

ContextParallel::ContextParallel(std::shared_ptr<comm::Communicator> group, ContextSplit split)
    : group_(std::move(group)), split_(split) {
  if (group_ == nullptr) throw InvalidArgument("context parallelism needs a group");
  member_positions_.resize(static_cast<std::size_t>(group_->size()));
}

void ContextParallel::set_length(std::int64_t length) {
  if (length == length_) return;
  std::vector<std::vector<std::int64_t>> members;
  for (int r = 0; r < degree(); ++r) {
    std::vector<std::int64_t> positions;
    for (const Chunk& chunk : context_chunks(length, degree(), r, split_))
      for (std::int64_t t = chunk.offset; t < chunk.offset + chunk.size; ++t)
        positions.push_back(t);
    members.push_back(std::move(positions));
  }
  member_positions_ = std::move(members);
  pieces_.clear();
  for (const Chunk& chunk : context_chunks(length, degree(), rank(), split_))
    pieces_.emplace_back(chunk.offset, chunk.size);
  length_ = length;
}

const std::vector<std::int64_t>& ContextParallel::positions() const {
  return member_positions_[static_cast<std::size_t>(rank())];
}

std::vector<std::pair<std::int64_t, std::int64_t>> ContextParallel::pieces() const {
  return pieces_;
}

Tensor ContextParallel::gather(const Tensor& given) {
  const Tensor local = given.contiguous();
  const auto rows = static_cast<std::int64_t>(positions().size());
  if (local.rank() != 3 || local.dtype() != DType::f32 || local.shape()[1] != rows) {
    throw InvalidArgument(
        fmt::format("context parallelism: gather takes f32 [batch, {}, width], got {} {}", rows,
                    dtype_name(local.dtype()), local.shape().to_string()));
  }
  const std::int64_t batch = local.shape()[0];
  const std::int64_t width = local.shape()[2];
  std::vector<std::int64_t> counts;
  std::int64_t total = 0;
  for (const auto& member : member_positions_) {
    counts.push_back(batch * static_cast<std::int64_t>(member.size()) * width);
    total += counts.back();
  }
  Tensor all = Tensor::uninitialized(Shape{total}, DType::f32);
  comm::CollectiveOptions options;
  options.label = "context-parallel gather";
  group_->all_gather(local.reshape(Shape{local.numel()}), all, counts, options);
  gathered_bytes_ += local.numel() * 4;
  ++gathers_;
  Tensor whole = Tensor::uninitialized(Shape{batch, length_, width}, DType::f32);
  const float* in = all.values<float>().data();
  float* out = whole.values<float>().data();
  for (const auto& member : member_positions_) {
    for (std::int64_t b = 0; b < batch; ++b) {
      for (const std::int64_t t : member) {
        std::copy_n(in, width, out + (b * length_ + t) * width);
        in += width;
      }
    }
  }
  return whole;
}

Tensor ContextParallel::local_rows(const Tensor& given) const {
  const Tensor whole = given.contiguous();
  if (whole.rank() < 2 || whole.shape()[1] != length_) {
    throw InvalidArgument(fmt::format("context parallelism: expected [batch, {}, ...] rows, got {}",
                                      length_, whole.shape().to_string()));
  }
  std::vector<std::int64_t> dims = whole.shape().dims();
  const std::int64_t batch = dims[0];
  dims[1] = static_cast<std::int64_t>(positions().size());
  Tensor out = Tensor::uninitialized(Shape(dims), whole.dtype());
  const std::int64_t row_bytes =
      static_cast<std::int64_t>(whole.bytes().size()) / std::max<std::int64_t>(1, batch * length_);
  const std::byte* in = whole.bytes().data();
  std::byte* o = out.bytes().data();
  for (std::int64_t b = 0; b < batch; ++b) {
    for (const std::int64_t t : positions()) {
      std::memcpy(o, in + (b * length_ + t) * row_bytes, static_cast<std::size_t>(row_bytes));
      o += row_bytes;
    }
  }
  return out;
}

}  // namespace meshtensor::cp
