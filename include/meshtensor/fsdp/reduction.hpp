#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include <meshtensor/comm/communicator.hpp>
#include <meshtensor/core/dtype.hpp>
#include <meshtensor/fsdp/shard_layout.hpp>
#include <meshtensor/kernels/binned_sum.hpp>

namespace meshtensor::fsdp {

/// How a gradient reduction divides: by `pre` before the sum (in f32, before converting to the
/// reduce dtype) and by `post` after it (in f32), pre * post being the whole factor.
struct DivideFactors {
  double pre = 1.0;
  double post = 1.0;
};

/// The factors of a sum over `ranks` ranks in `reduce_dtype` that must end divided by `total`.
/// f32, f64 and bf16 (whose range is f32's) sum, then divide once: pre = 1. f16 tops out at
/// 65504, so its addends are first divided by a power of two near sqrt(ranks) (exact: it only
/// moves the exponent) and the sum by the rest: sums of `ranks` values near the top of the range
/// do not overflow, and small values do not flush to zero either. InvalidArgument unless ranks
/// >= 1 and total is positive and finite.
DivideFactors divide_factors(DType reduce_dtype, std::int64_t ranks, double total);

/// A divide factor exact mode can apply inside its one rounding: a positive integer (at most
/// 2^62). InvalidArgument naming the value otherwise.
std::int64_t exact_divisor(double factor);

/// Reduce-scatters the digit sums of `sums` (its elements being `layout`'s whole parameters back
/// to back, its bins already agreed over `group` and aligned) into the digits of `slice` (this
/// rank's segment; its bins are the caller's): every digit plane of rank r's segment receives the
/// sum over the ranks of their elements of that segment. With contiguous chunks it runs one
/// collective per parameter and digit plane straight from `sums`; otherwise it packs the planes
/// into one buffer first. Integer digit sums: exact in any order.
void reduce_scatter_digits(comm::Communicator& group, const ShardLayout& layout,
                           const kernels::BinnedSums& sums, kernels::BinnedSums& slice,
                           const comm::CollectiveOptions& options);

/// The reduce-scatter form of reduce_binned_sums: rank r owns the `counts[r]` elements from the
/// sum of the counts before it, and receives in `rounded_segment` (f32 or f64 [counts[rank]],
/// contiguous) its segment of the merged sums, rounded once: the same bits reduce_binned_sums
/// gives those elements. `received` as there.
void reduce_scatter_binned_sums(comm::Communicator& group, kernels::BinnedSums& sums,
                                const std::vector<std::int64_t>& counts, std::int64_t divisor,
                                const Tensor& rounded_segment, const std::string& label,
                                kernels::BinnedSums& received);

/// Merges the binned sums of every rank of `group` and rounds (exact sum) / divisor into `rounded`
/// (f32 or f64 [count], contiguous) on every rank: the same bits as rounding the merged sums in
/// one place, for any number of ranks. Each rank takes one slice of the elements and receives
/// every other rank's state of it as it stands (bins and digit sums, all_to_all: no agreement on
/// bins first); it merges them (each element at the largest bin, digits aligned and summed:
/// integers far below 2^53, exact in any order) and rounds a chunk at a time, and the rounded
/// slices are all-gathered. Collective over `group`; `label` names the calls.
void reduce_binned_sums(comm::Communicator& group, kernels::BinnedSums& sums, std::int64_t divisor,
                        const Tensor& rounded, const std::string& label = {});
/// The same, with `received` as the buffer the other ranks' states arrive in (resized when its
/// size differs), so that a reduction repeated every step reuses one allocation.
void reduce_binned_sums(comm::Communicator& group, kernels::BinnedSums& sums, std::int64_t divisor,
                        const Tensor& rounded, const std::string& label,
                        kernels::BinnedSums& received);

}  // namespace meshtensor::fsdp
