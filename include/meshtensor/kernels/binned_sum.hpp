#pragma once

#include <cstdint>

#include <meshtensor/core/tensor.hpp>

namespace meshtensor::kernels {

/// Exact sums whose addends arrive over time and over ranks: per-sample products summed over a
/// batch, over micro-batches, then over the ranks holding the samples (training gradients in
/// exact mode). Whatever the order, the grouping and the moment each addend arrives, the state
/// reached is the same, so the rounded result depends on the multiset of addends only.
///
/// Each element keeps a *window* of three digits of 32 bits at fixed absolute positions: bin b
/// covers magnitudes below 2^(32b) and keeps the bits of every addend from 2^(32b - 32) down to
/// 2^(32b - 96); lower bits are truncated (toward zero) addend by addend. The bin is the smallest
/// one (at least kLowestBin) above every addend's magnitude: a maximum, so it is the same for any
/// order or split. When a larger addend raises it, the lowest digits are dropped whole, which is
/// exactly what truncating every earlier addend at the new window would have given: digits are
/// stored as plain sums of the addends' own digits, never carried. Digit sums are integers held
/// in doubles, exact for up to kMaxBinnedAddends addends per element.
///
/// Floor: the window's lowest digit is worth at most 2^-64 of the element's largest addend, so
/// each addend loses less than that (truncation toward zero). An addend is added exactly when its
/// lowest set bit lies inside the window: products of f32 values (at most 48 significant bits)
/// within 2^-17 of the largest always are; smaller ones may lose their lowest bits. Products of
/// f32 values are exact in f64, so sums of products of f32 inputs (x^T·dy, column sums, column
/// dot products) are the exact sums of those products down to that floor. A non-finite addend
/// (or one of 2^256 or more) makes the element
/// NaN.
struct BinnedSums {
  /// An empty accumulator for `count` elements: bins at kLowestBin, digits zero.
  explicit BinnedSums(std::int64_t count = 0);
  /// Copies are deep (unlike Tensor handles): each accumulator owns its state.
  BinnedSums(const BinnedSums& other);
  /// Deep copy.
  BinnedSums& operator=(const BinnedSums& other);
  BinnedSums(BinnedSums&&) noexcept = default;
  BinnedSums& operator=(BinnedSums&&) noexcept = default;
  ~BinnedSums() = default;

  /// Number of elements.
  std::int64_t count() const { return bins.numel(); }
  /// Back to the empty state (keeps the storage).
  void clear();

  /// Per-element bin, i32 [count] (kNonFiniteBin marks NaN results).
  Tensor bins;
  /// Digit sums, f64 [3, count]: plane j holds the digit of weight 2^(32 * (bin - 3 + j)).
  Tensor digits;
};

/// Lowest bin: windows never reach below 2^-192.
inline constexpr std::int32_t kLowestBin = -3;
/// Bin of an element that saw a non-finite addend (its sum rounds to NaN).
inline constexpr std::int32_t kNonFiniteBin = 9;
/// Most addends one element may receive before its digit sums could round.
inline constexpr std::int64_t kMaxBinnedAddends = std::int64_t{1} << 21;

/// sums[offset + i * n + j] += sum over r of x[r][i] * dy[r][j] (x: f32 [rows, m], dy: f32
/// [rows, n]): the weight gradient x^T·dy of a linear layer.
void add_outer_products(BinnedSums& sums, std::int64_t offset, const Tensor& x, const Tensor& dy);

/// sums[offset + j] += sum over r of a[r][j] * b[r][j] (f32 [rows, n] each).
void add_column_products(BinnedSums& sums, std::int64_t offset, const Tensor& a, const Tensor& b);

/// sums[offset + j] += sum over r of a[r][j] (f32 or f64 [rows, n]).
void add_column_sums(BinnedSums& sums, std::int64_t offset, const Tensor& a);

/// Raises every element's bin to bins[i] (i32, each at least the element's own), dropping the
/// digits that fall below the new window: the step before adding digit sums of several
/// accumulators (for ranks: all-reduce the bins with max, align, all-reduce the digits with sum).
void align_bins(BinnedSums& sums, const Tensor& bins);

/// Adds `other`'s digits into `sums` after aligning both to the larger bins (`other` is left
/// aligned, holding the same sum it held).
void merge_binned_sums(BinnedSums& sums, BinnedSums& other);

/// out[i] = the correctly rounded value of (exact sum held in sums, element i) / divisor (f32 or
/// f64 `out`, contiguous, count elements): one rounding, ties to even; NaN for non-finite elements.
void round_binned_sums(const BinnedSums& sums, std::int64_t divisor, Tensor out);

}  // namespace meshtensor::kernels
