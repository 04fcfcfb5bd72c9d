#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include <gtest/gtest.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/core/random.hpp>
#include <meshtensor/kernels/binned_sum.hpp>
#include <meshtensor/kernels/simd.hpp>

#include "support/exact_sum_reference.hpp"
#include "support/spread_values.hpp"

namespace meshtensor::kernels {
namespace {

Tensor spread(std::int64_t rows, std::int64_t cols, std::uint64_t seed, int binades = 40) {
  return testing::spread_matrix(rows, cols, seed, binades);
}

std::vector<std::uint32_t> bits_of(const Tensor& t) {
  std::vector<std::uint32_t> out(static_cast<std::size_t>(t.numel()));
  std::memcpy(out.data(), t.bytes().data(), t.nbytes());
  return out;
}

/// The digits' result: add_outer_products into empty sums, then round_binned_sums.
std::vector<std::uint32_t> binned_outer(const Tensor& x, const Tensor& dy, std::int64_t divisor) {
  BinnedSums sums = BinnedSums::uninitialized(x.shape()[1] * dy.shape()[1]);
  add_outer_products(sums, 0, x, dy, Start::empty);
  Tensor out(Shape{sums.count()}, DType::f32);
  round_binned_sums(sums, divisor, out);
  return bits_of(out);
}

/// The digits' result of parts summed element by element, one add_column_sums row each.
std::vector<std::uint32_t> binned_elements(const std::vector<Tensor>& parts, std::int64_t divisor) {
  const std::int64_t count = parts.front().numel();
  BinnedSums sums = BinnedSums::uninitialized(count);
  for (std::size_t p = 0; p < parts.size(); ++p)
    add_column_sums(sums, 0, parts[p].reshape(Shape{1, count}),
                    p == 0 ? Start::empty : Start::sums);
  Tensor out(Shape{count}, DType::f32);
  round_binned_sums(sums, divisor, out);
  return bits_of(out);
}

struct Verified {
  std::vector<std::uint32_t> bits;
  VerifiedRounding counts;
};

Verified verified_outer(const Tensor& x, const Tensor& dy, std::int64_t divisor) {
  Tensor out(Shape{x.shape()[1], dy.shape()[1]}, DType::f32);
  const VerifiedRounding counts = round_outer_products(x, dy, divisor, out);
  return {bits_of(out), counts};
}

Verified verified_elements(const std::vector<Tensor>& parts, std::int64_t divisor) {
  Tensor out(Shape{parts.front().numel()}, DType::f32);
  const VerifiedRounding counts = round_element_sums(parts, divisor, out);
  return {bits_of(out), counts};
}

Tensor column(std::vector<double> values) {
  const auto rows = static_cast<std::int64_t>(values.size());
  return Tensor::from_values(Shape{rows, 1}, DType::f32, values);
}

/// (double) s / divisor rounded to f32 once more: what a plain f64 sum would give.
std::uint32_t naive(double sum, std::int64_t divisor) {
  return std::bit_cast<std::uint32_t>(static_cast<float>(sum / static_cast<double>(divisor)));
}

TEST(VerifiedSums, OuterProductsHaveTheDigitsBitsAndMostSettle) {
  for (const std::int64_t divisor : {1, 3, 2048}) {
    const Tensor x = spread(300, 24, 1, 12);
    const Tensor dy = spread(300, 40, 2, 12);
    const Verified got = verified_outer(x, dy, divisor);
    EXPECT_EQ(got.bits, binned_outer(x, dy, divisor)) << "divisor " << divisor;
    EXPECT_EQ(got.counts.settled + got.counts.fallbacks, 24 * 40);
    EXPECT_GT(got.counts.settled, 24 * 40 * 95 / 100) << "divisor " << divisor;
  }
}

TEST(VerifiedSums, ElementSumsHaveTheDigitsBitsAndMostSettle) {
  std::vector<Tensor> parts;
  for (std::uint64_t p = 0; p < 5; ++p)
    parts.push_back(spread(1, 777, 10 + p, 20).reshape(Shape{777}));
  for (const std::int64_t divisor : {1, 7}) {
    const Verified got = verified_elements(parts, divisor);
    EXPECT_EQ(got.bits, binned_elements(parts, divisor));
    EXPECT_GT(got.counts.settled, 777 * 95 / 100);
  }
}

TEST(VerifiedSums, CancellingSumsFallBackWhereverTheF64SumWouldRoundWrong) {
  // Per element {L, x, -L} in that order (an f64 sum loses x's low bits against L, or all of x)
  // for L and x over many binades apart, both signs: every result must be the digits', and every
  // element whose plain f64 result differs from them must have fallen back.
  std::vector<double> larges;
  std::vector<double> smalls;
  for (int e = -60; e <= 100; e += 7) {
    for (int below = 0; below <= 80; below += 3) {
      for (const double sign : {1.0, -1.0}) {
        larges.push_back(std::ldexp(1.0, e));
        smalls.push_back(sign * static_cast<float>(std::ldexp(1.0 + 0x1.234567p-3, e - below)));
      }
    }
  }
  const auto count = static_cast<std::int64_t>(larges.size());
  std::vector<double> minus(larges);
  for (double& v : minus)
    v = -v;
  const std::vector<Tensor> parts = {Tensor::from_values(Shape{count}, DType::f32, larges),
                                     Tensor::from_values(Shape{count}, DType::f32, smalls),
                                     Tensor::from_values(Shape{count}, DType::f32, minus)};
  for (const std::int64_t divisor : {1, 3}) {
    const Verified got = verified_elements(parts, divisor);
    const auto want = binned_elements(parts, divisor);
    ASSERT_EQ(got.bits, want);
    std::int64_t wrong_if_plain = 0;
    for (std::int64_t e = 0; e < count; ++e) {
      const auto i = static_cast<std::size_t>(e);
      const double plain = (larges[i] + smalls[i]) + minus[i];
      wrong_if_plain += naive(plain, divisor) != want[i] ? 1 : 0;
    }
    EXPECT_GT(wrong_if_plain, 0);  // the cases are adversarial: a plain sum gets some wrong
    EXPECT_GE(got.counts.fallbacks, wrong_if_plain);
  }
  // The same sums as outer products: x a column of ones, dy the three terms.
  for (std::int64_t e = 0; e < count; e += 5) {
    const auto i = static_cast<std::size_t>(e);
    const Tensor ones = column({1.0, 1.0, 1.0});
    const Tensor terms = column({larges[i], smalls[i], minus[i]});
    const Verified got = verified_outer(ones, terms, 1);
    ASSERT_EQ(got.bits, binned_outer(ones, terms, 1)) << larges[i] << " " << smalls[i];
  }
}

TEST(VerifiedSums, SumsOnAndBesideF32MidpointsRoundToNearestEven) {
  // 1 + 2^-24 is the midpoint between 1 and its f32 successor: exactly on it, ties go to even
  // (1); 2^-60 above it, up. An f64 sum of {1, 2^-24, 2^-60} is 1 + 2^-24 exactly: only the
  // digits can tell the two apart. 2^-70 lies below the digits' floor (2^-63 of the largest):
  // the digits drop it, and so must the fast path.
  for (const double scale : {1.0, 0x1p-30, 0x1p40}) {
    for (const double above : {0.0, 0x1p-60, -0x1p-60, 0x1p-70}) {
      const std::vector<double> terms = {scale, scale * 0x1p-24, scale * above};
      std::vector<Tensor> parts;
      testing::ExactSumReference reference;
      for (const double t : terms) {
        parts.push_back(Tensor::from_values(Shape{1}, DType::f32, std::vector<double>{t}));
        reference.add(static_cast<float>(t));
      }
      const Verified got = verified_elements(parts, 1);
      const auto want = binned_elements(parts, 1);
      EXPECT_EQ(got.bits, want) << scale << " " << above;
      if (std::fabs(above) >= 0x1p-63) {
        EXPECT_EQ(want[0], reference.rounded(8, 23));
      }
      // On the tie the f64 sum is exact (three addends within 2^29 of each other): it settles,
      // ties to even; beside it only the digits can decide.
      EXPECT_EQ(got.counts.fallbacks, above == 0.0 ? 0 : 1) << scale << " " << above;
      const Tensor ones = column({1.0, 1.0, 1.0});
      EXPECT_EQ(verified_outer(ones, column(terms), 1).bits, binned_outer(ones, column(terms), 1))
          << scale << " " << above;
    }
  }
}

TEST(VerifiedSums, ExactSumsSettleOnTiesWithPowerOfTwoDivisorsOnly) {
  // {1, 2^-24} and {1, 3·2^-24}: exact f64 sums on f32 midpoints, ties to even (down, then up).
  for (const double odd : {1.0, 3.0}) {
    const std::vector<Tensor> parts = {
        Tensor::from_values(Shape{1}, DType::f32, std::vector<double>{1.0}),
        Tensor::from_values(Shape{1}, DType::f32, std::vector<double>{odd * 0x1p-24})};
    for (const std::int64_t divisor : {1, 4, 1024, 3}) {
      const Verified got = verified_elements(parts, divisor);
      EXPECT_EQ(got.bits, binned_elements(parts, divisor)) << odd << " / " << divisor;
      // A power of two divides exactly and the tie settles; 3 leaves an inexact quotient.
      const bool power_of_two = divisor != 3;
      if (power_of_two) {
        EXPECT_EQ(got.counts.fallbacks, 0);
      }
    }
  }
}

TEST(VerifiedSums, ZeroSubnormalOverflowAndNonFiniteResultsMatchTheDigits) {
  const float largest = std::numeric_limits<float>::max();
  const float tiny = std::numeric_limits<float>::denorm_min();
  const std::vector<std::vector<double>> cases = {
      {1.5, -1.5},            // exactly zero: +0
      {-0.0, -0.0},           // zero from negative zeros
      {largest, largest},     // overflows to infinity
      {tiny, tiny * 2},       // a subnormal result
      {INFINITY, 1.0},        // infinity
      {INFINITY, -INFINITY},  // NaN
      {NAN, 2.0},             // NaN
  };
  for (const auto& terms : cases) {
    std::vector<Tensor> parts;
    for (const double t : terms)
      parts.push_back(Tensor::from_values(Shape{1}, DType::f32, std::vector<double>{t}));
    EXPECT_EQ(verified_elements(parts, 1).bits, binned_elements(parts, 1)) << terms[0];
    const Tensor ones = column(std::vector<double>(terms.size(), 1.0));
    EXPECT_EQ(verified_outer(ones, column(terms), 1).bits, binned_outer(ones, column(terms), 1))
        << terms[0];
  }
  // 0 * inf is NaN in both.
  const Verified zero_times_inf = verified_outer(column({0.0, 1.0}), column({INFINITY, 1.0}), 1);
  EXPECT_TRUE(std::isnan(std::bit_cast<float>(zero_times_inf.bits[0])));
}

TEST(VerifiedSums, ManyBinadesAndDivisorsMatchTheDigitsAtEverySimdLevel) {
  // Values over 80 binades: heavy cancellation and wide windows, the fallback often needed.
  const Tensor x = spread(97, 13, 21, 80);
  const Tensor dy = spread(97, 29, 22, 80);
  // Few addends of few significant bits within a few binades: exact sums, ties everywhere.
  std::vector<Tensor> parts;
  for (std::uint64_t p = 0; p < 4; ++p) {
    Tensor part = spread(1, 3000, 30 + p, 4).reshape(Shape{3000});
    for (float& v : part.values<float>())
      v = std::ldexp(std::round(std::ldexp(v, 6)), -6);
    parts.push_back(part);
  }
  for (auto level : {SimdLevel::baseline, SimdLevel::avx2, SimdLevel::avx512}) {
    if (static_cast<int>(level) > static_cast<int>(best_simd_level())) continue;
    set_simd_level(level);
    for (const std::int64_t divisor : {1, 3, 64})
      EXPECT_EQ(verified_elements(parts, divisor).bits, binned_elements(parts, divisor))
          << "level " << static_cast<int>(level) << ", divisor " << divisor;
    for (const std::int64_t divisor :
         {std::int64_t{1}, std::int64_t{5}, std::int64_t{97}, (std::int64_t{1} << 40) + 3})
      EXPECT_EQ(verified_outer(x, dy, divisor).bits, binned_outer(x, dy, divisor))
          << "level " << static_cast<int>(level) << ", divisor " << divisor;
  }
  set_simd_level(best_simd_level());
}

TEST(VerifiedSums, RejectsWhatDoesNotFit) {
  Tensor out(Shape{6}, DType::f32);
  EXPECT_THROW(round_outer_products(spread(4, 2, 1, 4), spread(5, 3, 2, 4), 1, out),
               InvalidArgument);
  EXPECT_THROW(round_outer_products(spread(4, 2, 1, 4), spread(4, 3, 2, 4), 0, out),
               InvalidArgument);
  Tensor wrong(Shape{5}, DType::f32);
  EXPECT_THROW(round_outer_products(spread(4, 2, 1, 4), spread(4, 3, 2, 4), 1, wrong),
               InvalidArgument);
  const std::vector<Tensor> parts = {spread(1, 5, 1, 4).reshape(Shape{5})};
  EXPECT_THROW(round_element_sums(parts, 1, out), InvalidArgument);
}

}  // namespace
}  // namespace meshtensor::kernels
