#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include <fmt/format.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/core/half.hpp>
#include <meshtensor/kernels/binned_sum.hpp>
#include <meshtensor/kernels/elementwise.hpp>

#include "simd_dispatch.hpp"

namespace meshtensor::kernels {

BinnedSums::BinnedSums(std::int64_t count)
    : bins(Tensor::full(Shape{count}, DType::i32, kLowestBin)),
      digits(Tensor::zeros(Shape{3, count}, DType::f64)) {}

BinnedSums::BinnedSums(const BinnedSums& other)
    : bins(other.bins.clone()), digits(other.digits.clone()) {}

BinnedSums& BinnedSums::operator=(const BinnedSums& other) {
  if (this != &other) {
    bins = other.bins.clone();
    digits = other.digits.clone();
  }
  return *this;
}

void BinnedSums::clear() {
  bins.fill(kLowestBin);
  digits.fill(0.0);
}

namespace {

__extension__ using Int128 = __int128;
__extension__ using UInt128 = unsigned __int128;

constexpr double kDigitBase = 4294967296.0;  // 2^32
constexpr int kBinBits = 32;

std::int32_t bin_of_magnitude_bits(std::uint64_t magnitude_bits) {
  const int biased = static_cast<int>(magnitude_bits >> 52);
  if (biased == 0x7ff) return kNonFiniteBin;
  if (magnitude_bits == 0) return kLowestBin;
  const int exponent = biased - 1023;  // products of f32 values are never subnormal in f64
  const int bin =
      (exponent >= 0 ? exponent / kBinBits : -((-exponent + kBinBits - 1) / kBinBits)) + 1;
  if (bin >= kNonFiniteBin - 1 + 1) return kNonFiniteBin;  // 2^256 or more
  return std::max(bin, kLowestBin);
}

/// 2^(32 - 32 * bin): multiplying an addend below 2^(32 * bin) by it puts the top digit in the
/// integer part (exact: a power of two, far from the f64 range limits).
double top_digit_scale(std::int32_t bin) {
  const auto biased = static_cast<std::uint64_t>(1023 + kBinBits - kBinBits * bin);
  return std::bit_cast<double>(biased << 52);
}

/// Moves element i's digits up by `shift` bins (the lowest `shift` digits drop out).
inline void shift_digits(double* d0, double* d1, double* d2, std::int64_t i, std::int32_t shift) {
  if (shift <= 0) return;
  if (shift == 1) {
    d0[i] = d1[i];
    d1[i] = d2[i];
  } else if (shift == 2) {
    d0[i] = d2[i];
    d1[i] = 0;
  } else {
    d0[i] = 0;
    d1[i] = 0;
  }
  d2[i] = 0;
}

/// Columns one pass of the kernel keeps in registers.
constexpr std::int64_t kColumnBlock = 16;

/// The state of the accumulator elements one block of columns adds into.
struct BlockTarget {
  std::int32_t* bins;
  double* d0;
  double* d1;
  double* d2;
  std::int64_t width;  ///< elements in use (at most kColumnBlock)
};

/// Adds sum over t of a[t] * rows[index[t] * kColumnBlock + j] into the `target.width` elements
/// of one block of columns. First the largest |product| of each column raises
/// its bin (IEEE bits: integer order is magnitude order and puts NaN above infinity, so the
/// maximum is the same in any order); then every product drops its three window digits into the
/// digit sums. Truncation toward zero at each digit keeps the digits a function of the addend and
/// the window alone.
template <class T>
[[gnu::always_inline]] inline void add_block_body(const double* a, const std::int64_t* index,
                                                  std::int64_t terms, const double* rows,
                                                  BlockTarget target) {
  // Written with vector types: as a plain loop the compiler vectorises this maximum across rows
  // (gathers) instead of across the block's columns.
  constexpr std::int64_t kLanes = 8;
  using Bits = std::uint64_t __attribute__((vector_size(kLanes * 8)));
  using Values = double __attribute__((vector_size(kLanes * 8)));
  const Bits magnitude = Bits{} + ~(std::uint64_t{1} << 63);
  // Several independent running maxima: one chain of compare-and-select would wait on its own
  // latency every row.
  constexpr std::int64_t kChains = 4;
  constexpr std::int64_t kVectors = kColumnBlock / kLanes;
  Bits largest_bits[kChains][kVectors] = {};
  // Casts between vector types of one size keep the bits.
  const auto keep_larger = [](Bits& running, const Bits& candidate) {
    const Bits above = (Bits)(candidate > running);
    running = (candidate & above) | (running & ~above);
  };
  const auto take = [&](Bits& running, const double* values_at, double at) {
    Values values;
    std::memcpy(&values, values_at, sizeof values);
    keep_larger(running, (Bits)(values * at) & magnitude);
  };
  std::int64_t first = 0;
  for (; first + kChains <= terms; first += kChains) {
    for (std::int64_t c = 0; c < kChains; ++c) {
      const double* row = rows + index[first + c] * kColumnBlock;
      for (std::int64_t h = 0; h < kVectors; ++h)
        take(largest_bits[c][h], row + h * kLanes, a[first + c]);
    }
  }
  for (; first < terms; ++first) {
    const double* row = rows + index[first] * kColumnBlock;
    for (std::int64_t h = 0; h < kVectors; ++h)
      take(largest_bits[0][h], row + h * kLanes, a[first]);
  }
  for (std::int64_t c = 1; c < kChains; ++c)
    for (std::int64_t h = 0; h < kVectors; ++h)
      keep_larger(largest_bits[0][h], largest_bits[c][h]);
  std::uint64_t largest[kColumnBlock];
  std::memcpy(largest, largest_bits[0], sizeof largest);
  double scale[kColumnBlock];
  double acc0[kColumnBlock];
  double acc1[kColumnBlock];
  double acc2[kColumnBlock];
  for (std::int64_t j = 0; j < kColumnBlock; ++j) {
    if (j >= target.width) {
      scale[j] = acc0[j] = acc1[j] = acc2[j] = 0.0;
      continue;
    }
    const std::int32_t bin = std::max(target.bins[j], bin_of_magnitude_bits(largest[j]));
    shift_digits(target.d0, target.d1, target.d2, j, bin - target.bins[j]);
    target.bins[j] = bin;
    // Non-finite elements take no digits; a zero scale keeps them at zero.
    scale[j] = bin == kNonFiniteBin ? 0.0 : top_digit_scale(bin);
    acc0[j] = target.d0[j];
    acc1[j] = target.d1[j];
    acc2[j] = target.d2[j];
  }
  for (std::int64_t t = 0; t < terms; ++t) {
    const double at = a[t];
    const double* row = rows + index[t] * kColumnBlock;
    for (std::int64_t j = 0; j < kColumnBlock; ++j) {
      const double top = at * row[j] * scale[j];
      const double digit2 = std::trunc(top);
      const double middle = (top - digit2) * kDigitBase;
      const double digit1 = std::trunc(middle);
      const double digit0 = std::trunc((middle - digit1) * kDigitBase);
      acc2[j] += digit2;
      acc1[j] += digit1;
      acc0[j] += digit0;
    }
  }
  for (std::int64_t j = 0; j < target.width; ++j) {
    target.d0[j] = acc0[j];
    target.d1[j] = acc1[j];
    target.d2[j] = acc2[j];
  }
}
MESHTENSOR_SIMD_KERNEL(add_block, add_block_body)

struct Planes {
  std::int32_t* bins;
  double* d0;
  double* d1;
  double* d2;
};

Planes planes_of(BinnedSums& sums) {
  const std::int64_t count = sums.count();
  double* digits = sums.digits.values<double>().data();
  return {sums.bins.values<std::int32_t>().data(), digits, digits + count, digits + 2 * count};
}

/// The rows [rows, n] of addend factors as f64 column blocks: block b holds columns
/// b * kColumnBlock onwards of every row, row after row (zero-padded past n), so one pass over a
/// block reads contiguous memory and runs full-width vectors.
template <class T>
std::vector<double> pack_column_blocks(const T* values, std::int64_t rows, std::int64_t n) {
  const std::int64_t blocks = (n + kColumnBlock - 1) / kColumnBlock;
  std::vector<double> packed(static_cast<std::size_t>(blocks * rows * kColumnBlock), 0.0);
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t j = 0; j < n; ++j) {
      const std::int64_t block = j / kColumnBlock;
      packed[static_cast<std::size_t>((block * rows + r) * kColumnBlock + j % kColumnBlock)] =
          values[r * n + j];
    }
  }
  return packed;
}

/// Adds sum over t of a[t] * (row index[t], column j of `packed`) into elements offset ..
/// offset + n of `sums` (packed: pack_column_blocks of `rows` rows), every product exact in f64.
void add_row(Planes planes, std::int64_t offset, const double* a, const std::int64_t* index,
             std::int64_t terms, std::int64_t n, const std::vector<double>& packed,
             std::int64_t rows) {
  if (terms == 0) return;
  for (std::int64_t j0 = 0; j0 < n; j0 += kColumnBlock) {
    const std::int64_t i = offset + j0;
    const BlockTarget target{planes.bins + i, planes.d0 + i, planes.d1 + i, planes.d2 + i,
                             std::min(kColumnBlock, n - j0)};
    add_block<double>(a, index, terms, packed.data() + (j0 / kColumnBlock) * rows * kColumnBlock,
                      target);
  }
}

void check_rows_matrix(const Tensor& t, const char* what, const char* operation) {
  if (t.rank() != 2 || (t.dtype() != DType::f32 && t.dtype() != DType::f64)) {
    throw InvalidArgument(fmt::format("{}: {} must be a 2-D f32 or f64 tensor, got {} {}",
                                      operation, what, dtype_name(t.dtype()),
                                      t.shape().to_string()));
  }
}

void check_count(const BinnedSums& sums, std::int64_t expected, const char* operation) {
  if (sums.count() != expected) {
    throw InvalidArgument(fmt::format("{}: the accumulator holds {} elements, the inputs make {}",
                                      operation, sums.count(), expected));
  }
}

void check_range(const BinnedSums& sums, std::int64_t offset, std::int64_t length,
                 const char* operation) {
  if (offset < 0 || length > sums.count() || offset > sums.count() - length) {
    throw InvalidArgument(fmt::format("{}: elements [{}, {}) are outside the accumulator's {}",
                                      operation, offset, offset + length, sums.count()));
  }
}

void check_f32(const Tensor& t, const char* what, const char* operation) {
  if (t.dtype() != DType::f32) {
    throw InvalidArgument(fmt::format("{}: {} must be f32 (its products are exact in f64), got {}",
                                      operation, what, dtype_name(t.dtype())));
  }
}

}  // namespace

void add_outer_products(BinnedSums& sums, std::int64_t offset, const Tensor& x, const Tensor& dy) {
  const char* operation = "add_outer_products";
  check_rows_matrix(x, "x", operation);
  check_rows_matrix(dy, "dy", operation);
  check_f32(x, "x", operation);
  check_f32(dy, "dy", operation);
  if (x.shape()[0] != dy.shape()[0]) {
    throw InvalidArgument(
        fmt::format("{}: x has {} rows, dy {}", operation, x.shape()[0], dy.shape()[0]));
  }
  const std::int64_t rows = x.shape()[0];
  const std::int64_t m = x.shape()[1];
  const std::int64_t n = dy.shape()[1];
  check_range(sums, offset, m * n, operation);
  const Tensor x_dense = x.contiguous();
  const auto xs = x_dense.values<float>();
  const Tensor dy_dense = dy.contiguous();
  const std::vector<double> packed = pack_column_blocks(dy_dense.values<float>().data(), rows, n);
  Planes planes = planes_of(sums);
  std::vector<double> a;
  std::vector<std::int64_t> index;
  a.reserve(static_cast<std::size_t>(rows));
  index.reserve(static_cast<std::size_t>(rows));
  // 0 * inf is NaN here as in every other sum: rows where x is zero are skipped (ReLU, blank
  // pixels: they add nothing) only when dy holds no infinity or NaN.
  const auto dys = dy_dense.values<float>();
  const bool dy_finite =
      std::all_of(dys.begin(), dys.end(), [](float v) { return std::isfinite(v); });
  for (std::int64_t i = 0; i < m; ++i) {
    a.clear();
    index.clear();
    for (std::int64_t r = 0; r < rows; ++r) {
      const double value = xs[static_cast<std::size_t>(r * m + i)];  // exact
      if (value == 0.0 && dy_finite) continue;
      a.push_back(value);
      index.push_back(r);
    }
    add_row(planes, offset + i * n, a.data(), index.data(), static_cast<std::int64_t>(a.size()), n,
            packed, rows);
  }
}

void add_column_products(BinnedSums& sums, std::int64_t offset, const Tensor& a, const Tensor& b) {
  const char* operation = "add_column_products";
  check_rows_matrix(a, "a", operation);
  check_rows_matrix(b, "b", operation);
  check_f32(a, "a", operation);
  check_f32(b, "b", operation);
  if (a.shape() != b.shape()) {
    throw InvalidArgument(
        fmt::format("{}: a is {}, b {}", operation, a.shape().to_string(), b.shape().to_string()));
  }
  Tensor products = convert(a, DType::f64);
  const Tensor b64 = convert(b, DType::f64);
  auto values = products.values<double>();
  const auto bs = b64.values<double>();
  for (std::size_t i = 0; i < values.size(); ++i)
    values[i] *= bs[i];  // exact: f32 products
  add_column_sums(sums, offset, products);
}

void add_column_sums(BinnedSums& sums, std::int64_t offset, const Tensor& a) {
  const char* operation = "add_column_sums";
  check_rows_matrix(a, "a", operation);
  const std::int64_t rows = a.shape()[0];
  const std::int64_t n = a.shape()[1];
  check_range(sums, offset, n, operation);
  const Tensor a64 = a.dtype() == DType::f64 ? a.contiguous() : convert(a, DType::f64);
  const double* values = a64.values<double>().data();
  const std::vector<double> ones(static_cast<std::size_t>(rows), 1.0);
  std::vector<std::int64_t> index(static_cast<std::size_t>(rows));
  std::iota(index.begin(), index.end(), std::int64_t{0});
  add_row(planes_of(sums), offset, ones.data(), index.data(), rows, n,
          pack_column_blocks(values, rows, n), rows);
}

namespace {

/// Moves element i of `planes` to bin `bin` (at least its own), dropping the digits below the new
/// window; InvalidArgument for a bin outside the valid range or below the element's.
inline void raise_bin(Planes planes, std::int64_t i, std::int32_t bin, const char* operation) {
  const std::int32_t current = planes.bins[i];
  if (bin == current) return;
  if (bin < current || bin > kNonFiniteBin) {
    throw InvalidArgument(
        fmt::format("{}: element {} cannot move from bin {} to {}", operation, i, current, bin));
  }
  shift_digits(planes.d0, planes.d1, planes.d2, i, bin - current);
  planes.bins[i] = bin;
}

}  // namespace

void align_bins(BinnedSums& sums, const Tensor& bins) {
  if (bins.dtype() != DType::i32 || bins.numel() != sums.count()) {
    throw InvalidArgument(fmt::format("align_bins needs {} i32 bins, got {} {}", sums.count(),
                                      bins.numel(), dtype_name(bins.dtype())));
  }
  const Planes planes = planes_of(sums);
  const std::int32_t* target = bins.values<std::int32_t>().data();
  for (std::int64_t i = 0; i < sums.count(); ++i)
    raise_bin(planes, i, target[i], "align_bins");
}

void merge_binned_sums(BinnedSums& sums, BinnedSums& other) {
  check_count(sums, other.count(), "merge_binned_sums");
  const Planes mine = planes_of(sums);
  const Planes theirs = planes_of(other);
  for (std::int64_t i = 0; i < sums.count(); ++i) {
    const std::int32_t top = std::max(mine.bins[i], theirs.bins[i]);
    raise_bin(mine, i, top, "merge_binned_sums");
    raise_bin(theirs, i, top, "merge_binned_sums");
    mine.d0[i] += theirs.d0[i];
    mine.d1[i] += theirs.d1[i];
    mine.d2[i] += theirs.d2[i];
  }
}

namespace {

/// The one rounding of an exact sum: the digit sums of one element (integers below 2^53 in
/// magnitude) at bin `bin`, divided by `divisor`, rounded to nearest-even in the format of
/// `exponent_bits` / `mantissa_bits`. Returns the bit pattern.
std::uint64_t round_digits(const double* digit, std::int32_t bin, std::uint64_t divisor,
                           int exponent_bits, int mantissa_bits) {
  // The digit sums are integers below 2^53 in magnitude: the total fits 118 bits.
  const auto as_int = [&](int plane) {
    return static_cast<Int128>(static_cast<std::int64_t>(digit[plane]));
  };
  const Int128 total = (as_int(2) << 64) + (as_int(1) << 32) + as_int(0);
  const bool negative = total < 0;
  UInt128 magnitude = negative ? -static_cast<UInt128>(total) : static_cast<UInt128>(total);
  int exponent = kBinBits * bin - 3 * kBinBits;
  bool sticky = false;
  if (std::has_single_bit(divisor)) {
    // Dividing by a power of two only moves the exponent.
    exponent -= static_cast<int>(std::bit_width(divisor)) - 1;
  } else if (magnitude != 0) {
    // Put the leading bit at position 127 so the quotient keeps at least 64 bits.
    const auto high = static_cast<std::uint64_t>(magnitude >> 64);
    const int shift = high != 0 ? std::countl_zero(high)
                                : 64 + std::countl_zero(static_cast<std::uint64_t>(magnitude));
    magnitude <<= shift;
    exponent -= shift;
    // One 64-bit division gives a quotient of at least 64 - bit_width(divisor) bits; rounding
    // needs the kept bits, a guard bit and the sticky bit.
    if (64 - static_cast<int>(std::bit_width(divisor)) >= mantissa_bits + 2) {
      // (high * 2^64 + low) / d = q * 2^64 + (r * 2^64 + low) / d with the last term below
      // 2^64: q is the quotient truncated at 2^64, inexact when r or low is not zero.
      const auto top = static_cast<std::uint64_t>(magnitude >> 64);
      sticky = top % divisor != 0 || static_cast<std::uint64_t>(magnitude) != 0;
      magnitude = top / divisor;
      exponent += 64;
    } else {
      const UInt128 quotient = magnitude / divisor;
      sticky = quotient * divisor != magnitude;
      magnitude = quotient;
    }
  }
  const auto high = static_cast<std::uint64_t>(magnitude >> 64);
  if (high != 0) {
    const int shift = 64 - std::countl_zero(high);
    sticky = sticky || (magnitude & ((UInt128{1} << shift) - 1)) != 0;
    magnitude >>= shift;
    exponent += shift;
  }
  const auto significand = static_cast<std::uint64_t>(magnitude);
  return significand == 0 ? 0
                          : round_to_format(negative, significand, exponent, sticky, exponent_bits,
                                            mantissa_bits);
}

/// a + b = sum + the returned error, exactly (Knuth's two-sum).
inline double two_sum_error(double a, double b, double sum) {
  const double b_part = sum - a;
  return (a - (sum - b_part)) + (b - b_part);
}

/// The f32 rounding of an element's digit sums times 2^exponent (a power-of-two divisor folded
/// in), through doubles: the digits sum to t + r exactly with |r| a few units in t's last place,
/// so rounding t to f32 is correct unless t lies within that distance of an f32 rounding
/// boundary (a midpoint), or the result is not a normal f32. Returns false then, for the exact
/// path to decide; the bits are the same either way.
inline bool round_digits_to_f32_fast(const double* digit, int exponent, std::uint32_t& bits) {
  const double high = digit[2] * 0x1p64;
  const double middle = digit[1] * 0x1p32;
  const double partial = high + middle;
  const double total = partial + digit[0];
  const double error =
      two_sum_error(high, middle, partial) + two_sum_error(partial, digit[0], total);
  if (total == 0.0) {
    if (error != 0.0) return false;
    bits = 0;
    return true;
  }
  // exponent is within [-350, 160] and |total| below 2^119: the product is a normal double.
  const double scaled =
      total * std::bit_cast<double>(static_cast<std::uint64_t>(1023 + exponent) << 52);
  const double magnitude = std::fabs(scaled);
  if (!(magnitude >= 0x1p-126 && magnitude < 0x1p127)) return false;
  // |error| <= |partial| / 2^53 + |total| / 2^53, and |partial| <= 2 |total| unless the total
  // cancelled, in which case the check below is taken against a tiny total and fails safe.
  if (std::fabs(error) > std::fabs(total) * 0x1p-51) return false;
  // The 29 bits f32 drops: a midpoint is 2^28; within 8 units of it the error could decide.
  const std::uint64_t dropped =
      std::bit_cast<std::uint64_t>(scaled) & ((std::uint64_t{1} << 29) - 1);
  constexpr std::uint64_t kMidpoint = std::uint64_t{1} << 28;
  if (dropped + 8 >= kMidpoint && dropped <= kMidpoint + 8) return false;
  bits = std::bit_cast<std::uint32_t>(static_cast<float>(scaled));
  return true;
}

}  // namespace

void round_binned_sums(const BinnedSums& sums, std::int64_t divisor, Tensor out) {
  if (divisor <= 0)
    throw InvalidArgument(fmt::format("round_binned_sums: divisor {} is not positive", divisor));
  if ((out.dtype() != DType::f32 && out.dtype() != DType::f64) || out.numel() != sums.count()) {
    throw InvalidArgument(
        fmt::format("round_binned_sums needs an f32 or f64 output of {} elements, "
                    "got {} {}",
                    sums.count(), dtype_name(out.dtype()), out.shape().to_string()));
  }
  const std::int64_t count = sums.count();
  const std::int32_t* bins = sums.bins.values<std::int32_t>().data();
  const double* planes = sums.digits.values<double>().data();
  const bool f32 = out.dtype() == DType::f32;
  const auto wide_divisor = static_cast<std::uint64_t>(divisor);
  const bool fast = f32 && std::has_single_bit(wide_divisor);
  const int divisor_log2 = static_cast<int>(std::bit_width(wide_divisor)) - 1;
  std::byte* out_bytes = out.bytes().data();
  for (std::int64_t i = 0; i < count; ++i) {
    const std::int32_t bin = bins[i];
    const double digit[3] = {planes[i], planes[count + i], planes[2 * count + i]};
    std::uint64_t bits = 0;
    std::uint32_t narrow = 0;
    if (bin == kNonFiniteBin) {
      bits = f32 ? 0x7fc00000u : 0x7ff8000000000000ull;  // the canonical NaN
    } else if (fast && round_digits_to_f32_fast(digit, kBinBits * bin - 3 * kBinBits - divisor_log2,
                                                narrow)) {
      bits = narrow;
    } else {
      bits = round_digits(digit, bin, wide_divisor, f32 ? 8 : 11, f32 ? 23 : 52);
    }
    if (f32) {
      narrow = static_cast<std::uint32_t>(bits);
      std::memcpy(out_bytes + i * 4, &narrow, sizeof narrow);
    } else {
      std::memcpy(out_bytes + i * 8, &bits, sizeof bits);
    }
  }
}

}  // namespace meshtensor::kernels
