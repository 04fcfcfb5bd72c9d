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

void reduce_binned_sums(comm::Communicator& group, kernels::BinnedSums& sums, std::int64_t divisor,
                        const Tensor& rounded, const std::string& label) {
  kernels::BinnedSums received;
  reduce_binned_sums(group, sums, divisor, rounded, label, received);
}

namespace {

/// Sends every other rank the planes of its segment of `sums` (counts[r] elements from
/// displacement r) and receives theirs of this rank's segment into `received`, which holds them
/// rank after rank (this rank's own left out): bins and each digit plane. Two all_to_alls per
/// plane, one towards lower ranks and one towards higher ranks, so that no rank copies its own
/// segment.
void exchange_segments(comm::Communicator& group, const kernels::BinnedSums& sums,
                       const std::vector<std::int64_t>& counts, kernels::BinnedSums& received,
                       const std::string& label) {
  const int me = group.rank();
  const auto ranks = static_cast<std::size_t>(group.size());
  const std::vector<std::int64_t> starts = comm::displacements(counts);
  const std::int64_t mine = counts[static_cast<std::size_t>(me)];
  const std::int64_t own_start = starts[static_cast<std::size_t>(me)];
  const std::int64_t own_end = own_start + mine;
  const std::int64_t received_below = me * mine;  // from the lower ranks, first
  comm::CollectiveOptions options;
  options.label = label.empty() ? std::string() : fmt::format("{} (parts)", label);
  // Counts towards (send) and from (receive) the ranks on one side of this one.
  const auto side = [&](bool lower, bool sending) {
    std::vector<std::int64_t> side_counts(ranks, 0);
    for (std::size_t r = 0; r < ranks; ++r) {
      const bool on_side =
          lower ? r < static_cast<std::size_t>(me) : r > static_cast<std::size_t>(me);
      if (on_side) side_counts[r] = sending ? counts[r] : mine;
    }
    return side_counts;
  };
  const auto exchange_plane = [&](const Tensor& plane, const Tensor& into) {
    // Towards the lower ranks: the elements before this rank's segment; the higher ranks' parts
    // arrive after the lower ranks' ones.
    group.all_to_all(plane.narrow(0, 0, own_start),
                     into.narrow(0, received_below, into.numel() - received_below),
                     side(true, true), side(false, false), options);
    group.all_to_all(plane.narrow(0, own_end, plane.numel() - own_end),
                     into.narrow(0, 0, received_below), side(false, true), side(true, false),
                     options);
  };
  const std::int64_t count = sums.count();
  const std::int64_t total = received.count();
  exchange_plane(sums.bins, received.bins);
  for (std::int64_t j = 0; j < 3; ++j) {
    exchange_plane(sums.digits.narrow(0, j, 1).reshape(Shape{count}),
                   received.digits.narrow(0, j, 1).reshape(Shape{total}));
  }
}

}  // namespace

void reduce_scatter_binned_sums(comm::Communicator& group, kernels::BinnedSums& sums,
                                const std::vector<std::int64_t>& counts, std::int64_t divisor,
                                const Tensor& rounded_segment, const std::string& label,
                                kernels::BinnedSums& received) {
  const int ranks = group.size();
  const int me = group.rank();
  const std::int64_t mine = counts.at(static_cast<std::size_t>(me));
  const std::int64_t own_start = comm::displacements(counts)[static_cast<std::size_t>(me)];
  if (ranks == 1) {
    kernels::round_binned_sums(sums, divisor, rounded_segment);
    return;
  }
  // Every other rank's state of this rank's segment, unaligned: bins need no agreement first.
  const std::int64_t received_count = (ranks - 1) * mine;
  if (received.count() != received_count)
    received = kernels::BinnedSums::uninitialized(received_count);
  exchange_segments(group, sums, counts, received, label);
  // Merge and round a chunk at a time: the merged state stays in cache.
  constexpr std::int64_t kChunk = 2048;
  kernels::BinnedSums merged = kernels::BinnedSums::uninitialized(std::min(kChunk, mine));
  std::vector<kernels::BinnedPart> parts(static_cast<std::size_t>(ranks));
  for (std::int64_t begin = 0; begin < mine; begin += kChunk) {
    const std::int64_t n = std::min(kChunk, mine - begin);
    if (merged.count() != n) merged = kernels::BinnedSums::uninitialized(n);
    parts[0] = kernels::part_of(sums, own_start + begin);
    for (int r = 1; r < ranks; ++r)
      parts[static_cast<std::size_t>(r)] = kernels::part_of(received, (r - 1) * mine + begin);
    kernels::merge_binned_parts(merged, parts);
    kernels::round_binned_sums(merged, divisor, rounded_segment.narrow(0, begin, n));
  }
}

void reduce_binned_sums(comm::Communicator& group, kernels::BinnedSums& sums, std::int64_t divisor,
                        const Tensor& rounded, const std::string& label,
                        kernels::BinnedSums& received) {
  if (group.size() == 1) {
    kernels::round_binned_sums(sums, divisor, rounded);
    return;
  }
  // The elements as one parameter split over the ranks.
  const ShardLayout layout({Shape{sums.count()}}, {0}, group.size());
  const std::vector<std::int64_t>& counts = layout.counts();
  Tensor rounded_slice =
      Tensor::uninitialized(Shape{counts[static_cast<std::size_t>(group.rank())]}, rounded.dtype());
  reduce_scatter_binned_sums(group, sums, counts, divisor, rounded_slice, label, received);
  comm::CollectiveOptions gather;
  gather.label = label.empty() ? std::string() : fmt::format("{} (rounded)", label);
  group.all_gather(rounded_slice, rounded, counts, gather);
}

}  // namespace meshtensor::fsdp
