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

}  // namespace meshtensor::fsdp
