#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include <gtest/gtest.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/kernels/elementwise.hpp>
#include <meshtensor/kernels/simd.hpp>

namespace meshtensor::kernels {
namespace {

template <class T>
std::uint64_t bits_of(T value) {
  if constexpr (sizeof(T) == 8) return std::bit_cast<std::uint64_t>(value);
  if constexpr (sizeof(T) == 4) return std::bit_cast<std::uint32_t>(value);
  if constexpr (sizeof(T) == 2) return std::bit_cast<std::uint16_t>(value);
  if constexpr (sizeof(T) == 1) return std::bit_cast<std::uint8_t>(value);
}

Tensor scalar_tensor(DType dtype, double value) {
  return Tensor::full({1}, dtype, value);
}

// Combines a and b with `op` in the given order and returns the result's bits.
std::uint64_t combined_bits(DType dtype, double a, double b, ReduceOp op) {
  Tensor target = scalar_tensor(dtype, a);
  accumulate(target, scalar_tensor(dtype, b), op);
  return visit_dtype(dtype, [&](auto zero) { return bits_of(target.values<decltype(zero)>()[0]); });
}

TEST(Accumulate, MaxAndMinAreOrderFreeForNaNAndSignedZeros) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  const double specials[] = {nan, -nan, -0.0, 0.0, 1.0, -1.0, inf, -inf, 1e-30};
  for (DType dtype : {DType::f64, DType::f32, DType::bf16, DType::f16}) {
    for (ReduceOp op : {ReduceOp::max, ReduceOp::min}) {
      for (double a : specials) {
        for (double b : specials) {
          EXPECT_EQ(combined_bits(dtype, a, b, op), combined_bits(dtype, b, a, op))
              << dtype_name(dtype) << " " << reduce_op_name(op) << "(" << a << ", " << b << ")";
        }
      }
    }
  }
  EXPECT_EQ(combined_bits(DType::f32, -0.0, 0.0, ReduceOp::max), 0u);
  EXPECT_EQ(combined_bits(DType::f32, 0.0, -0.0, ReduceOp::min), 0x80000000u);
  EXPECT_EQ(combined_bits(DType::f32, -nan, 1.0, ReduceOp::max), 0x7FC00000u) << "canonical NaN";
  EXPECT_EQ(combined_bits(DType::bf16, 2.0, nan, ReduceOp::min), 0x7FC0u);
  EXPECT_EQ(combined_bits(DType::f16, 2.0, nan, ReduceOp::min), 0x7E00u);
  EXPECT_EQ(combined_bits(DType::f64, 2.0, nan, ReduceOp::max), 0x7FF8000000000000u);
}

TEST(Accumulate, SumsInTheDTypesArithmetic) {
  Tensor target = Tensor::from_values({3}, DType::f32, std::vector<double>{1, 0x1p-24, -3});
  accumulate(target, Tensor::from_values({3}, DType::f32, std::vector<double>{0x1p-24, 1, 3}),
             ReduceOp::sum);
  EXPECT_EQ(target.values<float>()[0], 1.0f) << "1 + 2^-24 ties to even in f32";
  EXPECT_EQ(target.values<float>()[2], 0.0f);
  // bf16 rounds after each addition: 256 + 1 is not representable and ties to even.
  Tensor half = scalar_tensor(DType::bf16, 256);
  accumulate(half, scalar_tensor(DType::bf16, 1), ReduceOp::sum);
  EXPECT_EQ(to_float(half.values<BFloat16>()[0]), 256.0f);
  accumulate(half, scalar_tensor(DType::bf16, 3), ReduceOp::avg);
  EXPECT_EQ(to_float(half.values<BFloat16>()[0]), 260.0f) << "avg adds; the caller divides";
}

TEST(Accumulate, IntegersWrapAndCompare) {
  Tensor target = scalar_tensor(DType::i32, std::numeric_limits<std::int32_t>::max());
  accumulate(target, scalar_tensor(DType::i32, 1), ReduceOp::sum);
  EXPECT_EQ(target.values<std::int32_t>()[0], std::numeric_limits<std::int32_t>::min());
  Tensor bytes = scalar_tensor(DType::u8, 200);
  accumulate(bytes, scalar_tensor(DType::u8, 100), ReduceOp::sum);
  EXPECT_EQ(bytes.values<std::uint8_t>()[0], 44);
  accumulate(bytes, scalar_tensor(DType::u8, 50), ReduceOp::max);
  EXPECT_EQ(bytes.values<std::uint8_t>()[0], 50);
  Tensor longs = scalar_tensor(DType::i64, -5);
  accumulate(longs, scalar_tensor(DType::i64, -9), ReduceOp::min);
  EXPECT_EQ(longs.values<std::int64_t>()[0], -9);
}

TEST(Accumulate, WorksOnViewsAndRejectsMismatches) {
  Tensor base = Tensor::zeros({4, 4}, DType::f64);
  Tensor view = base.narrow(1, 1, 2);
  accumulate(view, Tensor::full({4, 2}, DType::f64, 2), ReduceOp::sum);
  const std::int64_t inside[] = {3, 2};
  const std::int64_t outside[] = {3, 3};
  EXPECT_EQ(base.get(inside), 2);
  EXPECT_EQ(base.get(outside), 0);
  EXPECT_THROW(accumulate(view, Tensor::zeros({4, 2}, DType::f32), ReduceOp::sum), InvalidArgument);
  EXPECT_THROW(accumulate(view, Tensor::zeros({2, 4}, DType::f64), ReduceOp::sum), InvalidArgument);
}

TEST(ColumnSums, EveryLevelGivesThePlainLoopsBits) {
  // Values of many magnitudes, so that any other order or a fused product would round
  // differently; widths around the vector lengths.
  for (const std::int64_t n : {1, 15, 16, 17, 100, 384}) {
    const std::int64_t rows = 37;
    const Tensor a = Tensor::random_normal(Shape{rows, n}, DType::f32, 7);
    const Tensor b = Tensor::random_normal(Shape{rows, n}, DType::f32, 8);
    std::vector<float> scaled(a.values<float>().begin(), a.values<float>().end());
    for (std::size_t i = 0; i < scaled.size(); ++i)
      scaled[i] = std::ldexp(scaled[i], static_cast<int>(i % 29) - 14);
    std::vector<float> sums(static_cast<std::size_t>(n), 0.5f);
    std::vector<float> products(sums);
    for (std::int64_t r = 0; r < rows; ++r) {
      for (std::int64_t j = 0; j < n; ++j) {
        const auto i = static_cast<std::size_t>(r * n + j);
        sums[static_cast<std::size_t>(j)] += scaled[i];
        const float product = scaled[i] * b.values<float>()[i];
        products[static_cast<std::size_t>(j)] += product;
      }
    }
    for (const SimdLevel level : {SimdLevel::baseline, SimdLevel::avx2, SimdLevel::avx512}) {
      if (static_cast<int>(level) > static_cast<int>(best_simd_level())) continue;
      set_simd_level(level);
      std::vector<float> got(static_cast<std::size_t>(n), 0.5f);
      std::vector<float> got_products(got);
      column_sums_into(got.data(), scaled.data(), rows, n);
      column_products_into(got_products.data(), scaled.data(), b.values<float>().data(), rows, n);
      for (std::int64_t j = 0; j < n; ++j) {
        const auto at = static_cast<std::size_t>(j);
        ASSERT_EQ(std::bit_cast<std::uint32_t>(got[at]), std::bit_cast<std::uint32_t>(sums[at]))
            << "n " << n << " column " << j << " level " << static_cast<int>(level);
        ASSERT_EQ(std::bit_cast<std::uint32_t>(got_products[at]),
                  std::bit_cast<std::uint32_t>(products[at]))
            << "n " << n << " column " << j << " level " << static_cast<int>(level);
      }
    }
    set_simd_level(best_simd_level());
  }
}

TEST(Convert, RoundsOnceAndSaturates) {
  const Tensor source = Tensor::from_values(
      {4}, DType::f64, std::vector<double>{1.0 + 0x1p-11 + 0x1p-40, 70000, -2.5, 300.7});
  const Tensor as_f16 = convert(source, DType::f16);
  EXPECT_EQ(as_f16.values<Float16>()[0].bits, 0x3C01);
  EXPECT_EQ(as_f16.values<Float16>()[1].bits, 0x7C00);
  const Tensor as_u8 = convert(source, DType::u8);
  EXPECT_EQ(as_u8.values<std::uint8_t>()[2], 0);
  EXPECT_EQ(as_u8.values<std::uint8_t>()[3], 255);
  const Tensor as_i32 = convert(source, DType::i32);
  EXPECT_EQ(as_i32.values<std::int32_t>()[2], -2);
  const Tensor big = Tensor::from_values({1}, DType::i64, std::vector<double>{0x1p60});
  EXPECT_EQ(convert(big, DType::f32).values<float>()[0], 0x1p60f);
  EXPECT_TRUE(convert(source, DType::f64).bitwise_equal(source));
  EXPECT_TRUE(
      convert(as_f16, DType::f32).bitwise_equal(convert(convert(as_f16, DType::f64), DType::f32)));
}

TEST(Divide, RoundsOnceAndRejectsZero) {
  Tensor values = Tensor::from_values({2}, DType::f32, std::vector<double>{1, 10});
  divide(values, 3);
  EXPECT_EQ(values.values<float>()[0], 1.0f / 3.0f);
  EXPECT_EQ(values.values<float>()[1], 10.0f / 3.0f);
  Tensor ints = Tensor::from_values({2}, DType::i32, std::vector<double>{7, -7});
  divide(ints, 2);
  EXPECT_EQ(ints.values<std::int32_t>()[0], 4);  // 3.5 ties to even
  EXPECT_EQ(ints.values<std::int32_t>()[1], -4);
  EXPECT_THROW(divide(values, 0), InvalidArgument);
}

}  // namespace
}  // namespace meshtensor::kernels

namespace meshtensor::kernels {
namespace {

TEST(RoundedValues, AreTheBitsOfARoundTripThroughTheDtype) {
  // Ties both ways, subnormals, the largest values and overflow, infinities, NaNs with payloads.
  std::vector<std::uint32_t> bits = {0x00000000U, 0x80000000U, 0x3F808000U, 0x3F818000U,
                                     0x3F80FFFFU, 0x00000001U, 0x807FFFFFU, 0x007F8000U,
                                     0x7F7FFFFFU, 0xFF7F8000U, 0x7F800000U, 0xFF800000U,
                                     0x7FC00001U, 0xFF812345U, 0x7F800001U};
  std::uint64_t state = 7;
  for (int i = 0; i < 10000; ++i) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    bits.push_back(static_cast<std::uint32_t>(state >> 32));
  }
  Tensor values(Shape{static_cast<std::int64_t>(bits.size())}, DType::f32);
  std::memcpy(values.bytes().data(), bits.data(), bits.size() * 4);
  for (const DType dtype : {DType::bf16, DType::f16}) {
    const Tensor want = convert(convert(values, dtype), DType::f32);
    EXPECT_TRUE(rounded_values(values, dtype).bitwise_equal(want)) << dtype_name(dtype);
  }
  EXPECT_THROW(rounded_values(convert(values, DType::f64), DType::bf16), InvalidArgument);
}

}  // namespace
}  // namespace meshtensor::kernels
