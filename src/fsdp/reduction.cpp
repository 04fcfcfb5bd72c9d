#include <cmath>

#include <fmt/format.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/fsdp/reduction.hpp>

namespace meshtensor::fsdp {

DivideFactors divide_factors(DType reduce_dtype, std::int64_t ranks, double total) {
  if (ranks < 1) throw InvalidArgument(fmt::format("a reduction over {} ranks", ranks));
  if (!(total > 0) || !std::isfinite(total)) {
    throw InvalidArgument(
        fmt::format("gradient divide factor {} is not positive and finite", total));
  }
  if (reduce_dtype != DType::f16) return {1.0, total};
  const double pre =
      std::ldexp(1.0, static_cast<int>(std::lround(std::log2(static_cast<double>(ranks)) / 2.0)));
  return {pre, total / pre};
}

std::int64_t exact_divisor(double factor) {
  if (!(factor >= 1) || factor > 0x1p62 || factor != std::floor(factor)) {
    throw InvalidArgument(fmt::format(
        "exact mode divides gradients inside its one rounding, so the divide factor must be a "
        "positive integer; got {}",
        factor));
  }
  return static_cast<std::int64_t>(factor);
}

namespace {

/// The digit planes of `sums` packed for one reduce-scatter: rank r's segment holds its elements
/// of plane 0, then 1, then 2 (the [3, n] layout of its slice). Returns the buffer and the
/// per-rank counts.
std::pair<Tensor, std::vector<std::int64_t>> pack_digit_planes(const ShardLayout& layout,
                                                               const kernels::BinnedSums& sums) {
  const std::int64_t count = sums.count();
  Tensor send = Tensor::uninitialized(Shape{3 * count}, DType::f64);  // every element is packed
  const std::vector<std::int64_t> starts = comm::displacements(layout.counts());
  std::vector<std::int64_t> digit_counts;
  for (const std::int64_t c : layout.counts())
    digit_counts.push_back(3 * c);
  for (std::int64_t j = 0; j < 3; ++j) {
    std::vector<std::int64_t> plane_starts;
    for (std::size_t r = 0; r < starts.size(); ++r)
      plane_starts.push_back(3 * starts[r] + j * layout.counts()[r]);
    layout.pack(layout.parameter_views(sums.digits.narrow(0, j, 1).reshape(Shape{count})), send,
                plane_starts);
  }
  return {send, digit_counts};
}

}  // namespace

void reduce_scatter_digits(comm::Communicator& group, const ShardLayout& layout,
                           const kernels::BinnedSums& sums, kernels::BinnedSums& slice,
                           const comm::CollectiveOptions& options) {
  const int me = group.rank();
  const std::int64_t mine = layout.counts()[static_cast<std::size_t>(me)];
  if (sums.count() != layout.total() || slice.count() != mine || group.size() != layout.ranks()) {
    throw InvalidArgument(fmt::format(
        "reduce_scatter_digits: {} sums and a slice of {} for a layout of {} over {} ranks "
        "(the group has {})",
        sums.count(), slice.count(), layout.total(), layout.ranks(), group.size()));
  }
  if (!layout.chunks_contiguous()) {
    const auto [send, digit_counts] = pack_digit_planes(layout, sums);
    group.reduce_scatter(send, slice.digits.reshape(Shape{3 * mine}), digit_counts, options);
    return;
  }
  std::int64_t start = 0;
  for (std::size_t p = 0; p < layout.parameters(); ++p) {
    const std::int64_t numel = layout.shape(p).numel();
    std::vector<std::int64_t> counts;
    for (int r = 0; r < layout.ranks(); ++r)
      counts.push_back(layout.chunk_shape(p, r).numel());
    const std::int64_t at = layout.offset_in_segment(p, me);
    for (std::int64_t j = 0; j < 3; ++j) {
      group.reduce_scatter(
          sums.digits.narrow(0, j, 1).reshape(Shape{sums.count()}).narrow(0, start, numel),
          slice.digits.narrow(0, j, 1)
              .reshape(Shape{mine})
              .narrow(0, at, counts[static_cast<std::size_t>(me)]),
          counts, options);
    }
    start += numel;
  }
}

}  // namespace meshtensor::fsdp
