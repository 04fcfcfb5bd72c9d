#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/core/random.hpp>
#include <meshtensor/kernels/binned_sum.hpp>
#include <meshtensor/kernels/simd.hpp>

#include "support/error_message.hpp"
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

std::vector<std::byte> raw_bytes(const Tensor& t) {
  const auto bytes = t.bytes();
  return {bytes.begin(), bytes.end()};
}

Tensor rounded(const BinnedSums& sums, std::int64_t divisor = 1) {
  Tensor out(Shape{sums.count()}, DType::f32);
  round_binned_sums(sums, divisor, out);
  return out;
}

TEST(BinnedSums, OuterProductsAreCorrectlyRoundedExactSums) {
  const Tensor x = spread(60, 7, 1, 20);
  const Tensor dy = spread(60, 5, 2, 20);
  BinnedSums sums(35);
  add_outer_products(sums, 0, x, dy);
  for (const std::int64_t divisor : {1, 3, 60}) {
    const auto got = bits_of(rounded(sums, divisor));
    for (std::int64_t i = 0; i < 7; ++i) {
      for (std::int64_t j = 0; j < 5; ++j) {
        testing::ExactSumReference reference;
        for (std::int64_t r = 0; r < 60; ++r) {
          reference.add(
              static_cast<double>(x.values<float>()[static_cast<std::size_t>(r * 7 + i)]) *
              dy.values<float>()[static_cast<std::size_t>(r * 5 + j)]);
        }
        EXPECT_EQ(got[static_cast<std::size_t>(i * 5 + j)],
                  static_cast<std::uint32_t>(
                      reference.rounded(8, 23, static_cast<std::uint64_t>(divisor))))
            << i << "," << j << " / " << divisor;
      }
    }
  }
}

TEST(BinnedSums, AnySplitAndOrderOfTheRowsGivesTheSameBits) {
  const Tensor x = spread(97, 9, 3);
  const Tensor dy = spread(97, 11, 4);
  BinnedSums whole(99);
  add_outer_products(whole, 0, x, dy);
  const auto expected = bits_of(rounded(whole, 97));
  for (std::uint64_t trial = 0; trial < 20; ++trial) {
    // Rows in a shuffled order, cut into pieces, each piece in its own accumulator (a rank or a
    // micro-batch), merged in another order.
    std::vector<std::int64_t> order(97);
    std::iota(order.begin(), order.end(), 0);
    for (std::int64_t i = 96; i > 0; --i)
      std::swap(order[static_cast<std::size_t>(i)],
                order[static_cast<std::size_t>(
                    uniform_int_sample(trial, static_cast<std::uint64_t>(i), 0, i))]);
    const std::int64_t pieces = 1 + static_cast<std::int64_t>(trial % 7);
    std::vector<BinnedSums> parts(static_cast<std::size_t>(pieces), BinnedSums(99));
    for (std::int64_t p = 0; p < pieces; ++p) {
      const std::int64_t begin = 97 * p / pieces;
      const std::int64_t end = 97 * (p + 1) / pieces;
      // Add the piece's rows one at a time (windows rise as larger addends arrive).
      for (std::int64_t r = begin; r < end; ++r) {
        const std::int64_t row = order[static_cast<std::size_t>(r)];
        add_outer_products(parts[static_cast<std::size_t>(p)], 0, x.narrow(0, row, 1).contiguous(),
                           dy.narrow(0, row, 1).contiguous());
      }
    }
    BinnedSums merged(99);
    for (std::int64_t p = pieces; p-- > 0;)
      merge_binned_sums(merged, parts[static_cast<std::size_t>(p)]);
    ASSERT_EQ(bits_of(rounded(merged, 97)), expected) << "trial " << trial;
  }
}

TEST(BinnedSums, MergingPartsReachesThePairwiseMergedState) {
  // Pieces of rows with very different magnitudes, so that the parts' bins differ by 0 to 3 or
  // more and every shift of merge_binned_parts is taken.
  const std::int64_t count = 13 * 11;
  std::vector<BinnedSums> parts;
  for (std::uint64_t piece = 0; piece < 5; ++piece) {
    BinnedSums part(count);
    const Tensor x = spread(6, 13, 10 + piece, 90);
    const Tensor dy = spread(6, 11, 20 + piece, 90);
    add_outer_products(part, 0, x, dy);
    parts.push_back(part);
  }
  BinnedSums pairwise(count);
  for (BinnedSums part : parts)  // copies: merge_binned_sums aligns its second argument
    merge_binned_sums(pairwise, part);
  std::vector<BinnedPart> views;
  for (const BinnedSums& part : parts)
    views.push_back(part_of(part, 0));
  BinnedSums merged = BinnedSums::uninitialized(count);
  merge_binned_parts(merged, views);
  EXPECT_EQ(raw_bytes(merged.bins), raw_bytes(pairwise.bins));
  EXPECT_EQ(raw_bytes(merged.digits), raw_bytes(pairwise.digits));
  // A range of elements: the parts viewed from an offset.
  std::vector<BinnedPart> tail;
  for (const BinnedSums& part : parts)
    tail.push_back(part_of(part, 100));
  BinnedSums merged_tail = BinnedSums::uninitialized(count - 100);
  merge_binned_parts(merged_tail, tail);
  const std::vector<std::uint32_t> whole = bits_of(rounded(pairwise));
  EXPECT_EQ(bits_of(rounded(merged_tail)),
            std::vector<std::uint32_t>(whole.begin() + 100, whole.end()));
  EXPECT_THROW(merge_binned_parts(merged, {}), InvalidArgument);
}

TEST(BinnedSums, ALateLargeAddendDropsTheSameBitsAsIfItCameFirst) {
  Tensor small =
      Tensor::from_values(Shape{3, 1}, DType::f32, std::vector<double>{1e-30, 3e-25, -7e-28});
  Tensor large = Tensor::from_values(Shape{1, 1}, DType::f32, std::vector<double>{1e12});
  BinnedSums late(1);
  add_column_sums(late, 0, small);
  add_column_sums(late, 0, large);
  BinnedSums early(1);
  add_column_sums(early, 0, large);
  add_column_sums(early, 0, small);
  EXPECT_EQ(bits_of(rounded(late)), bits_of(rounded(early)));
  EXPECT_EQ(rounded(late).values<float>()[0], 1e12f);
}

TEST(BinnedSums, ColumnProductsAndSumsMatchTheReference) {
  const Tensor a = spread(40, 6, 5, 10);
  const Tensor b = spread(40, 6, 6, 10);
  BinnedSums sums(12);
  add_column_products(sums, 0, a, b);
  add_column_sums(sums, 6, a);
  const auto got = bits_of(rounded(sums));
  for (std::int64_t j = 0; j < 6; ++j) {
    testing::ExactSumReference products;
    testing::ExactSumReference plain;
    for (std::int64_t r = 0; r < 40; ++r) {
      const auto i = static_cast<std::size_t>(r * 6 + j);
      products.add(static_cast<double>(a.values<float>()[i]) * b.values<float>()[i]);
      plain.add(a.values<float>()[i]);
    }
    EXPECT_EQ(got[static_cast<std::size_t>(j)], products.rounded(8, 23));
    EXPECT_EQ(got[static_cast<std::size_t>(6 + j)], plain.rounded(8, 23));
  }
}

TEST(BinnedSums, AnyDivisorRoundsCorrectlyToF32AndF64) {
  // Small divisors take one 64-bit division, large ones (and f64 results) the wide one.
  const Tensor a = spread(30, 8, 11, 30);
  BinnedSums sums(8);
  add_column_sums(sums, 0, a);
  for (const std::int64_t divisor :
       {std::int64_t{1}, std::int64_t{2}, std::int64_t{3}, std::int64_t{255}, std::int64_t{511},
        std::int64_t{512}, std::int64_t{1000}, std::int64_t{65537}, (std::int64_t{1} << 40) + 3,
        std::numeric_limits<std::int64_t>::max()}) {
    Tensor single(Shape{8}, DType::f32);
    Tensor twice(Shape{8}, DType::f64);
    round_binned_sums(sums, divisor, single);
    round_binned_sums(sums, divisor, twice);
    for (std::int64_t j = 0; j < 8; ++j) {
      testing::ExactSumReference reference;
      for (std::int64_t r = 0; r < 30; ++r)
        reference.add(a.values<float>()[static_cast<std::size_t>(r * 8 + j)]);
      const auto d = static_cast<std::uint64_t>(divisor);
      EXPECT_EQ(bits_of(single)[static_cast<std::size_t>(j)], reference.rounded(8, 23, d))
          << j << " / " << divisor;
      EXPECT_EQ(std::bit_cast<std::uint64_t>(twice.values<double>()[static_cast<std::size_t>(j)]),
                reference.rounded(11, 52, d))
          << j << " / " << divisor;
    }
  }
}

TEST(BinnedSums, DigitSumsNextToF32MidpointsRoundCorrectly) {
  // Digit sums whose value lies on, or a few units of 2^-64 (of the window) beside, an f32
  // midpoint, with the digits split so their doubles cancel: the fast f32 rounding must hand
  // every such case to the exact path or get it right.
  std::vector<std::array<double, 3>> cases;
  for (const double k : {0.0, 12345.0, 8388607.0}) {
    // An f32 midpoint: 25 significant bits, the last one set.
    const double midpoint = 0x1p24 + 2.0 * k + 1.0;
    for (const double nudge : {-3.0, -1.0, 0.0, 1.0, 2.0}) {
      for (const int shift : {0, 8, 20}) {
        const double high = std::ldexp(midpoint, shift);
        cases.push_back({nudge, high, 0.0});
        cases.push_back({nudge - 0x1p32, high + 1.0, 0.0});  // the same value, split otherwise
        cases.push_back({nudge, 0.0, high});
        cases.push_back({nudge, -0x1p32, high + 1.0 / 0x1p32 * 0x1p32});
      }
    }
  }
  for (const std::int64_t divisor : {1, 2, 256, 3}) {
    for (const auto& digits : cases) {
      if (std::any_of(digits.begin(), digits.end(),
                      [](double d) { return d != std::trunc(d) || std::fabs(d) >= 0x1p53; }))
        continue;
      BinnedSums sums(1);
      sums.bins.values<std::int32_t>()[0] = 1;
      for (int plane = 0; plane < 3; ++plane)
        sums.digits.values<double>()[static_cast<std::size_t>(plane)] =
            digits[static_cast<std::size_t>(plane)];
      testing::ExactSumReference reference;
      for (int plane = 0; plane < 3; ++plane)
        reference.add(std::ldexp(digits[static_cast<std::size_t>(plane)], 32 * plane - 64));
      EXPECT_EQ(bits_of(rounded(sums, divisor))[0],
                reference.rounded(8, 23, static_cast<std::uint64_t>(divisor)))
          << digits[0] << " " << digits[1] << " " << digits[2] << " / " << divisor;
    }
  }
}

TEST(BinnedSums, NonFiniteAddendsMakeTheCanonicalNan) {
  Tensor a =
      Tensor::from_values(Shape{2, 2}, DType::f32, std::vector<double>{INFINITY, 1.0, 2.0, NAN});
  BinnedSums sums(2);
  add_column_sums(sums, 0, a);
  EXPECT_EQ(bits_of(rounded(sums)), (std::vector<std::uint32_t>{0x7fc00000u, 0x7fc00000u}));
}

TEST(BinnedSums, ZeroTimesInfinityIsNanInOuterAndColumnProducts) {
  // One convention for 0 * inf (NaN, as IEEE multiplication) in both kernels.
  Tensor x = Tensor::zeros(Shape{2, 1}, DType::f32);
  Tensor dy = Tensor::zeros(Shape{2, 1}, DType::f32);
  dy.values<float>()[0] = std::numeric_limits<float>::infinity();
  BinnedSums outer(1);
  add_outer_products(outer, 0, x, dy);
  BinnedSums column(1);
  add_column_products(column, 0, x, dy);
  EXPECT_TRUE(std::isnan(rounded(outer).values<float>()[0]));
  EXPECT_TRUE(std::isnan(rounded(column).values<float>()[0]));
}

TEST(BinnedSums, EverySimdLevelGivesTheSameBits) {
  const Tensor x = spread(50, 20, 7);
  const Tensor dy = spread(50, 37, 8);
  std::vector<std::vector<std::uint32_t>> results;
  for (auto level : {SimdLevel::baseline, SimdLevel::avx2, SimdLevel::avx512}) {
    if (static_cast<int>(level) > static_cast<int>(best_simd_level())) continue;
    set_simd_level(level);
    BinnedSums sums(740);
    add_outer_products(sums, 0, x, dy);
    results.push_back(bits_of(rounded(sums, 50)));
    // Fresh sinks (streaming stores where the planes are aligned, plain ones elsewhere).
    for (const std::int64_t offset : {0, 5}) {
      BinnedSums fresh = BinnedSums::uninitialized(740 + offset);
      fresh.clear(0, offset);  // the elements before the sums are rounded too
      add_outer_products(fresh, offset, x, dy, Start::empty);
      auto bits = bits_of(rounded(fresh, 50));
      results.emplace_back(bits.begin() + offset, bits.end());
    }
  }
  set_simd_level(best_simd_level());
  for (const auto& r : results)
    EXPECT_EQ(r, results.front());
}

TEST(BinnedSums, RejectsInputsThatDoNotFit) {
  BinnedSums sums(6);
  EXPECT_THROW(add_outer_products(sums, 0, spread(4, 2, 1), spread(4, 4, 2)), InvalidArgument);
  EXPECT_THROW(add_outer_products(sums, 0, spread(4, 2, 1), spread(5, 3, 2)), InvalidArgument);
  EXPECT_THROW(add_column_sums(sums, 4, spread(4, 3, 1)), InvalidArgument);
  Tensor out(Shape{6}, DType::f32);
  EXPECT_THROW(round_binned_sums(sums, 0, out), InvalidArgument);
}

TEST(BinnedSums, AlignBinsMovesEveryElementUpDroppingTheLowDigits) {
  // 37 elements: two full runs of 16 and a tail; shifts 0 to 3 bins and some already aligned.
  constexpr std::int64_t kCount = 37;
  BinnedSums sums(kCount);
  Tensor target(Shape{kCount}, DType::i32);
  auto bins = sums.bins.values<std::int32_t>();
  auto digits = sums.digits.values<double>();
  for (std::int64_t i = 0; i < kCount; ++i) {
    const auto k = static_cast<std::size_t>(i);
    bins[k] = static_cast<std::int32_t>(i % 5) - 2;
    for (std::int64_t plane = 0; plane < 3; ++plane)
      digits[static_cast<std::size_t>(plane * kCount + i)] = static_cast<double>(100 * plane + i);
    target.values<std::int32_t>()[k] =
        i < 16 ? bins[k] : bins[k] + static_cast<std::int32_t>(i % 4);
  }
  const BinnedSums before = sums;
  align_bins(sums, target);
  const auto old_digits = before.digits.values<double>();
  for (std::int64_t i = 0; i < kCount; ++i) {
    const auto k = static_cast<std::size_t>(i);
    const std::int32_t shift =
        target.values<std::int32_t>()[k] - before.bins.values<std::int32_t>()[k];
    const auto old = [&](std::int64_t plane) {
      return plane < 3 ? old_digits[static_cast<std::size_t>(plane * kCount + i)] : 0.0;
    };
    EXPECT_EQ(bins[k], target.values<std::int32_t>()[k]) << i;
    for (std::int64_t plane = 0; plane < 3; ++plane)
      EXPECT_EQ(digits[static_cast<std::size_t>(plane * kCount + i)], old(plane + shift))
          << "element " << i << " plane " << plane;
  }
  Tensor lower = sums.bins.clone();
  lower.values<std::int32_t>()[20] -= 1;
  EXPECT_THAT(testing::error_message([&] { align_bins(sums, lower); }),
              ::testing::HasSubstr("element 20 cannot move"));
}

}  // namespace
}  // namespace meshtensor::kernels
