#pragma once

#include <cstdint>
#include <span>

#include <meshtensor/core/tensor.hpp>

namespace meshtensor::kernels {

/// Exact sums whose addends arrive over time and over ranks: per-sample products summed over a
/// batch, over micro-batches, then over the ranks holding the samples (training gradients in
/// exact mode). Whatever the order, the grouping and the moment each addend arrives, the state
/// reached is the same, so the rounded result depends on the multiset of addends only.
///
/// Each element keeps a *window* of three digits of 32 bits at fixed absolute positions: bin b
/// holds addends below 2^(32b - 1), half its top, and keeps the digits of weight 2^(32b - 32),
/// 2^(32b - 64) and 2^(32b - 96). Each addend's top digit is its nearest multiple of the top unit
/// (ties to even), the next digit the nearest multiple of the next unit of what is left, and so on:
/// what remains below the lowest digit (at most half its unit) is dropped, addend by addend. The
/// bin is the smallest one (at least kLowestBin) that holds every addend, judged from a bound on
/// each: 2^(c(a) + c(b)) for a product a * b, where c(v) is the smallest integer with |v| < 2^c
/// (a maximum over the addends, so the same for any order or split). When a larger addend raises
/// it, the lowest digits are dropped whole, which is exactly what the higher window would have
/// taken from every earlier addend (an addend below half the top has a zero top digit in any
/// higher window): digits are stored as plain sums of the addends' own digits, never carried.
/// Digit sums are integers held in doubles, exact for up to kMaxBinnedAddends addends per element.
///
/// Floor: the largest addend is at least 2^(32b - 34) (its factors' bounds overstate it by at
/// most 4), so each addend loses at most 2^-63 of the element's largest. An addend is added
/// exactly when its lowest set bit lies inside the window: products of f32 values (at most 48
/// significant bits) within 2^-15 of the largest always are; smaller ones may lose their lowest
/// bits. Products of f32 values are exact in f64, so sums of products of f32 inputs (x^T·dy,
/// column sums, column dot products) are the exact sums of those products down to that floor.
/// A non-finite addend (0 * inf included), or one whose bound reaches 2^287 (never a product of
/// f32 values), makes the element NaN.
struct BinnedSums {
  /// An empty accumulator for `count` elements: bins at kLowestBin, digits zero.
  explicit BinnedSums(std::int64_t count = 0);
  /// An accumulator of `count` elements whose storage is not initialised: for a buffer written
  /// whole before it is read (a reduce-scatter's output).
  static BinnedSums uninitialized(std::int64_t count);
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
  /// Elements [offset, offset + length) back to the empty state.
  void clear(std::int64_t offset, std::int64_t length);

  /// Per-element bin, i32 [count] (kNonFiniteBin marks NaN results).
  Tensor bins;
  /// Digit sums, f64 [3, count]: plane j holds the digit of weight 2^(32 * (bin - 3 + j)).
  Tensor digits;
};

/// Lowest bin: windows never reach below 2^-192.
inline constexpr std::int32_t kLowestBin = -3;
/// Bin of an element that saw a non-finite addend (its sum rounds to NaN).
inline constexpr std::int32_t kNonFiniteBin = 10;
/// Most addends one element may receive before its digit sums could round.
inline constexpr std::int64_t kMaxBinnedAddends = std::int64_t{1} << 21;

/// What the elements an add_* call writes hold before it: `sums` adds to them; `empty` ignores
/// them (as if cleared first, without the pass over memory a clear costs).
enum class Start : std::uint8_t { sums, empty };

/// sums[offset + i * n + j] += sum over r of x[r][i] * dy[r][j] (x: f32 [rows, m], dy: f32
/// [rows, n]): the weight gradient x^T·dy of a linear layer.
void add_outer_products(BinnedSums& sums, std::int64_t offset, const Tensor& x, const Tensor& dy,
                        Start start = Start::sums);

/// sums[offset + j] += sum over r of a[r][j] * b[r][j] (f32 [rows, n] each).
void add_column_products(BinnedSums& sums, std::int64_t offset, const Tensor& a, const Tensor& b,
                         Start start = Start::sums);

/// sums[offset + j] += sum over r of a[r][j] (f32 or f64 [rows, n]).
void add_column_sums(BinnedSums& sums, std::int64_t offset, const Tensor& a,
                     Start start = Start::sums);

/// Raises every element's bin to bins[i] (i32, each at least the element's own), dropping the
/// digits that fall below the new window: the step before adding digit sums of several
/// accumulators (for ranks: all-reduce the bins with max, align, all-reduce the digits with sum).
void align_bins(BinnedSums& sums, const Tensor& bins);

/// Adds `other`'s digits into `sums` after aligning both to the larger bins (`other` is left
/// aligned, holding the same sum it held).
void merge_binned_sums(BinnedSums& sums, BinnedSums& other);

/// Read-only state of consecutive binned-sum elements held anywhere (part of a BinnedSums, a
/// buffer received from another rank): one bin and three digit sums per element, as BinnedSums
/// lays them out.
struct BinnedPart {
  const std::int32_t* bins;
  const double* d0;
  const double* d1;
  const double* d2;
};

/// The elements of `sums` from `offset` on, as a part.
BinnedPart part_of(const BinnedSums& sums, std::int64_t offset);

/// sums = the merge of `parts` over their first sums.count() elements: each element at the
/// largest of the parts' bins, its digit sums the sums of the parts' digits aligned to it (what
/// merge_binned_sums reaches, one pass for any number of parts, the parts untouched).
/// InvalidArgument for no parts.
void merge_binned_parts(BinnedSums& sums, std::span<const BinnedPart> parts);

/// out[i] = the correctly rounded value of (exact sum held in sums, element i) / divisor (f32 or
/// f64 `out`, contiguous, count elements): one rounding, ties to even; NaN for non-finite elements.
void round_binned_sums(const BinnedSums& sums, std::int64_t divisor, Tensor out);

/// What round_outer_products did: how many elements the verified f64 sum settled and how many
/// fell back to the digits.
struct VerifiedRounding {
  std::int64_t settled = 0;
  std::int64_t fallbacks = 0;
};

/// out = x^T·dy / divisor rounded to f32 (out: f32, contiguous, [m, n] elements in row-major
/// order) with the bits of add_outer_products into empty sums followed by round_binned_sums,
/// for a sum that is whole here (nothing else will be added to it). Each element's f64 sum of
/// the exact f32 products, with a rigorous bound on its distance from the binned sum, settles
/// the element when every value within the bound rounds to one nonzero finite f32; the elements
/// it cannot settle (the bound straddles a rounding boundary, a zero or an overflow, or an input
/// is not finite) take the digits. See docs/training.md, "The verified fast path".
VerifiedRounding round_outer_products(const Tensor& x, const Tensor& dy, std::int64_t divisor,
                                      Tensor out);

/// out[e] = (Σ over the parts of part[e]) / divisor rounded to f32 (every part f32 of
/// out.numel() elements; out f32, contiguous) with the bits of add_column_sums of each part as
/// one row into empty sums followed by round_binned_sums: round_outer_products's verified fast
/// path for sums of a few whole tensors (a layer's output summed over its exact blocks).
VerifiedRounding round_element_sums(std::span<const Tensor> parts, std::int64_t divisor,
                                    Tensor out);

}  // namespace meshtensor::kernels
