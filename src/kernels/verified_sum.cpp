// The verified fast path of exact sums that are whole in one place: an f64 sum with a rigorous
// bound settles the elements whose every possible value rounds alike; the rest take the digits.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include <fmt/format.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/core/profile.hpp>
#include <meshtensor/kernels/binned_sum.hpp>
#include <meshtensor/kernels/elementwise.hpp>
#include <meshtensor/kernels/matmul.hpp>

#include "simd_dispatch.hpp"

namespace meshtensor::kernels {

namespace {

/// Absolute slack of every bound: covers the binned sum's floor (each addend keeps its digits
/// down to at least 2^-192, so fewer than 2^21 addends drop less than 2^-172 together) and keeps
/// every quantity of the check far from f64's subnormals.
constexpr double kAbsoluteSlack = 0x1p-160;

/// The bound on |s - V| for an f64 sum s, in any order, of `addends` terms whose magnitudes add
/// up to at most `magnitude` (computed in f64 from exact terms), where V is the binned sum of the
/// same terms. Recursive summation in any order errs by at most (n - 1)·2^-53·Σ|t| (plus terms of
/// order 2^-106); the binned sum drops less than half its lowest digit unit from each term, and
/// that unit is at most 2^-62 of the largest term's bound (at most 4 times the term): n·2^-63·Σ|t|.
/// n·2^-52 covers both with room for the rounding of `magnitude` itself and of this product.
[[gnu::always_inline]] inline double error_bound(double magnitude, double addends) {
  return magnitude * (addends * 0x1p-52) + kAbsoluteSlack;
}

/// Whether every real value within `bound` of `sum` / `divisor` rounds to one f32, decided from
/// the two ends of a (slightly widened) interval, as rounding to nearest is monotone: q = sum /
/// divisor errs by at most 2^-52·|q|, the division of the bound shrinks it by at most 2^-53
/// relative, and each end is rounded once more; the widening (2^-40 of the bound, 2^-48 of |q|)
/// covers all of these. `exact` (1, else 0): the sum is the binned sum itself and q is exact (a
/// divisor that is a power of two), so q rounds once, ties to even, as the digits round. Writes
/// the ends rounded to f32.
[[gnu::always_inline]] inline void round_ends(double sum, double bound, double divisor,
                                              double exact, float& low, float& high) {
  const double q = sum / divisor;
  const double margin =
      exact != 0.0 ? 0.0 : (bound / divisor) * (1.0 + 0x1p-40) + std::fabs(q) * 0x1p-48;
  low = static_cast<float>(q - margin);
  high = static_cast<float>(q + margin);
}

/// An element's result: the ends' common bits when they agree on a finite f32 that is not zero
/// (zero only for an exact sum: `zero_allowed` 1), else NaN's bits, never a settled result (a
/// non-finite sum or bound always takes the digits). Bitwise, not short-circuit, conditions: the
/// loops over elements vectorise.
[[gnu::always_inline]] inline std::uint32_t settled_bits(float low, float high,
                                                         float zero_allowed) {
  const auto low_bits = std::bit_cast<std::uint32_t>(low);
  const bool settled = (low_bits == std::bit_cast<std::uint32_t>(high)) &
                       (((low_bits & 0x7fffffffu) != 0) | (zero_allowed != 0.0f)) &
                       ((low_bits & 0x7f800000u) != 0x7f800000u);
  return settled ? low_bits : 0x7fc00000u;
}

constexpr std::uint32_t kUnsettled = 0x7fc00000u;

/// Elements a pass of the settling loops keeps on the stack.
constexpr std::int64_t kSettleChunk = 512;

/// out[e] = the settled bits of sums[e] with error_bound(magnitudes[e], addends), e < count.
template <class T>
[[gnu::always_inline]] inline void settle_all_body(const double* sums, const double* magnitudes,
                                                   double addends, double divisor,
                                                   std::uint32_t* out, std::int64_t count) {
  float low[kSettleChunk];
  float high[kSettleChunk];
  for (std::int64_t e0 = 0; e0 < count; e0 += kSettleChunk) {
    const std::int64_t n = std::min(kSettleChunk, count - e0);
    for (std::int64_t e = 0; e < n; ++e)
      round_ends(sums[e0 + e], error_bound(magnitudes[e0 + e], addends), divisor, 0.0, low[e],
                 high[e]);
    for (std::int64_t e = 0; e < n; ++e)
      out[e0 + e] = settled_bits(low[e], high[e], 0.0f);
  }
}
MESHTENSOR_SIMD_KERNEL(settle_all, settle_all_body)

/// Whether an f64 sum of `addends` f32 values, the largest (in magnitude) `largest` and the
/// smallest nonzero `smallest`, is exact in any order and equal to their binned sum: every one is
/// a multiple of the smallest one's f32 unit, at least smallest·2^-24, and every partial sum is
/// below addends·largest, which this keeps within 2^53 of that unit. The digits keep every
/// multiple of their lowest unit, at most 2^-62 of the largest, whole.
[[gnu::always_inline]] inline bool exact_in_f64(double largest, double smallest, double addends) {
  return largest * addends <= smallest * 0x1p29;
}

/// out[e] = the settled bits of Σ_p parts[p][e] (f64 sums of the f32 values, in part order) for
/// e < count, a cache-sized chunk of elements at a time. Sums that are exact (exact_in_f64, the
/// common case of a few addends of similar size) settle even on a rounding tie.
template <class T>
[[gnu::always_inline]] inline void settle_parts_body(const float* const* parts,
                                                     std::int64_t part_count, double divisor,
                                                     double power_of_two, std::uint32_t* out,
                                                     std::int64_t count) {
  const auto addends = static_cast<double>(part_count);
  const double infinity = std::numeric_limits<double>::infinity();
  for (std::int64_t e0 = 0; e0 < count; e0 += kSettleChunk) {
    const std::int64_t n = std::min(kSettleChunk, count - e0);
    double sums[kSettleChunk] = {};
    double magnitudes[kSettleChunk] = {};
    double largest[kSettleChunk] = {};
    double smallest[kSettleChunk];
    std::fill_n(smallest, n, infinity);
    for (std::int64_t p = 0; p < part_count; ++p) {
      const float* part = parts[p] + e0;
      for (std::int64_t e = 0; e < n; ++e) {
        const double v = part[e];
        const double size = std::fabs(v);
        sums[e] += v;
        magnitudes[e] += size;
        largest[e] = size > largest[e] ? size : largest[e];
        const double nonzero = size == 0.0 ? infinity : size;
        smallest[e] = nonzero < smallest[e] ? nonzero : smallest[e];
      }
    }
    float low[kSettleChunk];
    float high[kSettleChunk];
    float exact[kSettleChunk];
    for (std::int64_t e = 0; e < n; ++e) {
      const double is_exact =
          power_of_two != 0.0 && exact_in_f64(largest[e], smallest[e], addends) ? 1.0 : 0.0;
      round_ends(sums[e], error_bound(magnitudes[e], addends), divisor, is_exact, low[e], high[e]);
      exact[e] = static_cast<float>(is_exact);
    }
    for (std::int64_t e = 0; e < n; ++e)
      out[e0 + e] = settled_bits(low[e], high[e], exact[e]);
  }
}
MESHTENSOR_SIMD_KERNEL(settle_parts, settle_parts_body)

/// squares[j] = Σ_r m[r][j]² in f64 (m: f32 [rows, n], contiguous).
template <class T>
[[gnu::always_inline]] inline void column_squares_body(const float* m, std::int64_t rows,
                                                       std::int64_t n, double* squares) {
  std::fill_n(squares, n, 0.0);
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* row = m + r * n;
    for (std::int64_t j = 0; j < n; ++j) {
      const double v = row[j];
      squares[j] += v * v;
    }
  }
}
MESHTENSOR_SIMD_KERNEL(column_squares, column_squares_body)

std::uint32_t* bits_of(Tensor& out) {
  return reinterpret_cast<std::uint32_t*>(out.bytes().data());
}

void check_output(const Tensor& out, std::int64_t count, const char* operation) {
  if (out.dtype() != DType::f32 || !out.is_contiguous() || out.numel() != count) {
    throw InvalidArgument(fmt::format("{} needs a contiguous f32 output of {} elements, got {} {}",
                                      operation, count, dtype_name(out.dtype()),
                                      out.shape().to_string()));
  }
}

void check_divisor(std::int64_t divisor, const char* operation) {
  if (divisor <= 0)
    throw InvalidArgument(fmt::format("{}: divisor {} is not positive", operation, divisor));
}

bool all_finite(const Tensor& t) {
  bool finite = true;
  for (const float v : t.values<float>())
    finite = finite && v - v == 0.0f;
  return finite;
}

/// The digits for the unsettled elements of out (x^T·dy, [m, n]): row i's take one binned outer
/// product of x's column i with the gathered columns of dy. An element's binned state depends on
/// its own terms only, so it is the state the whole product would reach.
std::int64_t outer_fallbacks(const Tensor& x, const Tensor& dy, std::int64_t divisor,
                             std::uint32_t* out) {
  const std::int64_t rows = x.shape()[0];
  const std::int64_t m = x.shape()[1];
  const std::int64_t n = dy.shape()[1];
  const float* dys = dy.values<float>().data();
  std::int64_t total = 0;
  std::vector<std::int64_t> columns;
  for (std::int64_t i = 0; i < m; ++i) {
    columns.clear();
    for (std::int64_t j = 0; j < n; ++j)
      if (out[i * n + j] == kUnsettled) columns.push_back(j);
    if (columns.empty()) continue;
    const auto count = static_cast<std::int64_t>(columns.size());
    Tensor gathered = Tensor::uninitialized(Shape{rows, count}, DType::f32);
    float* g = gathered.values<float>().data();
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t c = 0; c < count; ++c)
        g[r * count + c] = dys[r * n + columns[static_cast<std::size_t>(c)]];
    BinnedSums sums = BinnedSums::uninitialized(count);
    add_outer_products(sums, 0, x.narrow(1, i, 1), gathered, Start::empty);
    Tensor rounded = Tensor::uninitialized(Shape{count}, DType::f32);
    round_binned_sums(sums, divisor, rounded);
    const std::uint32_t* r = bits_of(rounded);
    for (std::int64_t c = 0; c < count; ++c)
      out[i * n + columns[static_cast<std::size_t>(c)]] = r[c];
    total += count;
  }
  return total;
}

}  // namespace

VerifiedRounding round_outer_products(const Tensor& x, const Tensor& dy, std::int64_t divisor,
                                      Tensor out) {
  const ProfileScope profile(ProfileRow::exact_sums);
  const char* operation = "round_outer_products";
  check_divisor(divisor, operation);
  if (x.rank() != 2 || dy.rank() != 2 || x.dtype() != DType::f32 || dy.dtype() != DType::f32 ||
      x.shape()[0] != dy.shape()[0]) {
    throw InvalidArgument(fmt::format("{} needs f32 [rows, m] and [rows, n], got {} {} and {} {}",
                                      operation, dtype_name(x.dtype()), x.shape().to_string(),
                                      dtype_name(dy.dtype()), dy.shape().to_string()));
  }
  const std::int64_t rows = x.shape()[0];
  const std::int64_t m = x.shape()[1];
  const std::int64_t n = dy.shape()[1];
  check_output(out, m * n, operation);
  const Tensor xs = x.contiguous();
  const Tensor dys = dy.contiguous();
  std::uint32_t* bits = bits_of(out);
  if (rows == 0 || rows > kMaxBinnedAddends || !all_finite(xs) || !all_finite(dys)) {
    // Nothing to verify (or no bound): every element takes the digits, NaN rules included.
    BinnedSums sums = BinnedSums::uninitialized(m * n);
    add_outer_products(sums, 0, xs, dys, Start::empty);
    round_binned_sums(sums, divisor, out);
    return {0, m * n};
  }
  // Products of f32 values are exact in f64: the f64 matmul's only errors are its additions.
  Tensor sums = Tensor::uninitialized(Shape{m, n}, DType::f64);
  matmul(convert(xs, DType::f64), Transpose::yes, convert(dys, DType::f64), Transpose::no, sums);
  // Σ_r |x_ri·dy_rj| <= |x_i|·|dy_j| (Cauchy-Schwarz); the computed norms' few relative 2^-31 are
  // inside error_bound's room.
  std::vector<double> x_squares(static_cast<std::size_t>(m));
  std::vector<double> dy_squares(static_cast<std::size_t>(n));
  column_squares<float>(xs.values<float>().data(), rows, m, x_squares.data());
  column_squares<float>(dys.values<float>().data(), rows, n, dy_squares.data());
  std::vector<double> magnitudes(static_cast<std::size_t>(n));
  const double* s = sums.values<double>().data();
  for (std::int64_t i = 0; i < m; ++i) {
    for (std::int64_t j = 0; j < n; ++j)
      magnitudes[static_cast<std::size_t>(j)] = std::sqrt(x_squares[static_cast<std::size_t>(i)] *
                                                          dy_squares[static_cast<std::size_t>(j)]);
    settle_all<float>(s + i * n, magnitudes.data(), static_cast<double>(rows),
                      static_cast<double>(divisor), bits + i * n, n);
  }
  const std::int64_t fallbacks = outer_fallbacks(xs, dys, divisor, bits);
  return {m * n - fallbacks, fallbacks};
}

VerifiedRounding round_element_sums(std::span<const Tensor> parts, std::int64_t divisor,
                                    Tensor out) {
  const ProfileScope profile(ProfileRow::exact_sums);
  const char* operation = "round_element_sums";
  check_divisor(divisor, operation);
  const std::int64_t count = out.numel();
  check_output(out, count, operation);
  for (const Tensor& part : parts) {
    if (part.dtype() != DType::f32 || part.numel() != count) {
      throw InvalidArgument(fmt::format("{}: every part must be f32 of {} elements, got {} {}",
                                        operation, count, dtype_name(part.dtype()),
                                        part.shape().to_string()));
    }
  }
  std::vector<Tensor> dense;
  dense.reserve(parts.size());
  for (const Tensor& part : parts)
    dense.push_back(part.contiguous());
  std::vector<const float*> pointers;
  for (const Tensor& part : dense)
    pointers.push_back(part.values<float>().data());
  std::uint32_t* bits = bits_of(out);
  settle_parts<float>(
      pointers.data(), static_cast<std::int64_t>(pointers.size()), static_cast<double>(divisor),
      std::has_single_bit(static_cast<std::uint64_t>(divisor)) ? 1.0 : 0.0, bits, count);
  // The unsettled elements' parts as the columns of one matrix, one row a part.
  std::vector<std::int64_t> unsettled;
  for (std::int64_t e = 0; e < count; ++e)
    if (bits[e] == kUnsettled) unsettled.push_back(e);
  if (unsettled.empty()) return {count, 0};
  const auto fallbacks = static_cast<std::int64_t>(unsettled.size());
  const auto rows = static_cast<std::int64_t>(dense.size());
  Tensor gathered = Tensor::uninitialized(Shape{rows, fallbacks}, DType::f32);
  float* g = gathered.values<float>().data();
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* part = dense[static_cast<std::size_t>(r)].values<float>().data();
    for (std::int64_t c = 0; c < fallbacks; ++c)
      g[r * fallbacks + c] = part[unsettled[static_cast<std::size_t>(c)]];
  }
  BinnedSums binned = BinnedSums::uninitialized(fallbacks);
  add_column_sums(binned, 0, gathered, Start::empty);
  Tensor rounded = Tensor::uninitialized(Shape{fallbacks}, DType::f32);
  round_binned_sums(binned, divisor, rounded);
  const std::uint32_t* r = bits_of(rounded);
  for (std::int64_t c = 0; c < fallbacks; ++c)
    bits[unsettled[static_cast<std::size_t>(c)]] = r[c];
  return {count - fallbacks, fallbacks};
}

}  // namespace meshtensor::kernels
