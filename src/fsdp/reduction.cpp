#include <cmath>

#include <fmt/format.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/fsdp/reduction.hpp>
#include <meshtensor/mesh/layout.hpp>

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
comm::CollectiveOptions options_for(ReduceOp op, const std::string& label, const char* step) {
  comm::CollectiveOptions options;
  options.op = op;
  options.mode = comm::ReductionMode::ordered;
  options.label = label.empty() ? std::string() : fmt::format("{} ({})", label, step);
  return options;
}
}  // namespace

void reduce_binned_sums(comm::Communicator& group, kernels::BinnedSums& sums, std::int64_t divisor,
                        const Tensor& rounded, const std::string& label) {
  const std::int64_t count = sums.count();
  const int ranks = group.size();
  if (ranks == 1) {
    kernels::round_binned_sums(sums, divisor, rounded);
    return;
  }
  Tensor bins = sums.bins.clone();
  group.all_reduce(bins, options_for(ReduceOp::max, label, "bins"));
  kernels::align_bins(sums, bins);
  std::vector<std::int64_t> counts;
  for (int r = 0; r < ranks; ++r)
    counts.push_back(chunk_extent(count, ranks, r).size);
  const Chunk mine = chunk_extent(count, ranks, group.rank());
  kernels::BinnedSums slice(mine.size);
  slice.bins.copy_from(bins.narrow(0, mine.offset, mine.size));
  // The three digit planes travel in one reduce-scatter: rank r's segment holds its elements of
  // plane 0, then plane 1, then plane 2, which is the [3, count] layout of its slice.
  Tensor send(Shape{3 * count}, DType::f64);
  std::vector<std::int64_t> digit_counts;
  std::int64_t at = 0;
  for (int r = 0; r < ranks; ++r) {
    const Chunk c = chunk_extent(count, ranks, r);
    for (std::int64_t p = 0; p < 3; ++p) {
      send.narrow(0, at, c.size)
          .copy_from(sums.digits.narrow(0, p, 1).reshape(Shape{count}).narrow(0, c.offset, c.size));
      at += c.size;
    }
    digit_counts.push_back(3 * c.size);
  }
  group.reduce_scatter(send, slice.digits.reshape(Shape{3 * mine.size}), digit_counts,
                       options_for(ReduceOp::sum, label, "digits"));
  Tensor rounded_slice(Shape{mine.size}, rounded.dtype());
  kernels::round_binned_sums(slice, divisor, rounded_slice);
  comm::CollectiveOptions gather;
  gather.label = label.empty() ? std::string() : fmt::format("{} (rounded)", label);
  group.all_gather(rounded_slice, rounded, counts, gather);
}

}  // namespace meshtensor::fsdp
