#include <algorithm>

#include <fmt/format.h>

#include <meshtensor/comm/binned_reduction.hpp>
#include <meshtensor/mesh/layout.hpp>

namespace meshtensor::comm {

void reduce_binned_sums(Communicator& group, kernels::BinnedSums& sums, std::int64_t divisor,
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
void exchange_segments(Communicator& group, const kernels::BinnedSums& sums,
                       const std::vector<std::int64_t>& counts, kernels::BinnedSums& received,
                       const std::string& label) {
  const int me = group.rank();
  const auto ranks = static_cast<std::size_t>(group.size());
  const std::vector<std::int64_t> starts = displacements(counts);
  const std::int64_t mine = counts[static_cast<std::size_t>(me)];
  const std::int64_t own_start = starts[static_cast<std::size_t>(me)];
  const std::int64_t own_end = own_start + mine;
  const std::int64_t received_below = me * mine;  // from the lower ranks, first
  CollectiveOptions options;
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

void reduce_scatter_binned_sums(Communicator& group, kernels::BinnedSums& sums,
                                const std::vector<std::int64_t>& counts, std::int64_t divisor,
                                const Tensor& rounded_segment, const std::string& label,
                                kernels::BinnedSums& received) {
  const int ranks = group.size();
  const int me = group.rank();
  const std::int64_t mine = counts.at(static_cast<std::size_t>(me));
  const std::int64_t own_start = displacements(counts)[static_cast<std::size_t>(me)];
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

void reduce_binned_sums(Communicator& group, kernels::BinnedSums& sums, std::int64_t divisor,
                        const Tensor& rounded, const std::string& label,
                        kernels::BinnedSums& received) {
  if (group.size() == 1) {
    kernels::round_binned_sums(sums, divisor, rounded);
    return;
  }
  // The elements split over the ranks as torch.chunk splits them.
  std::vector<std::int64_t> counts;
  for (int r = 0; r < group.size(); ++r)
    counts.push_back(chunk_extent(sums.count(), group.size(), r).size);
  Tensor rounded_slice =
      Tensor::uninitialized(Shape{counts[static_cast<std::size_t>(group.rank())]}, rounded.dtype());
  reduce_scatter_binned_sums(group, sums, counts, divisor, rounded_slice, label, received);
  CollectiveOptions gather;
  gather.label = label.empty() ? std::string() : fmt::format("{} (rounded)", label);
  group.all_gather(rounded_slice, rounded, counts, gather);
}

void all_reduce_binned_sums(Communicator& group, kernels::BinnedSums& sums,
                            const std::string& label) {
  if (group.size() == 1) return;
  Tensor bins = sums.bins.clone();
  CollectiveOptions options;
  options.op = ReduceOp::max;
  options.label = label.empty() ? std::string() : fmt::format("{} (bins)", label);
  group.all_reduce(bins, options);
  kernels::align_bins(sums, bins);
  options.op = ReduceOp::sum;
  options.label = label.empty() ? std::string() : fmt::format("{} (digits)", label);
  group.all_reduce(sums.digits, options);
}

}  // namespace meshtensor::comm
