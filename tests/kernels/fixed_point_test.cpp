#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <span>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include <meshtensor/core/random.hpp>
#include <meshtensor/core/tensor.hpp>
#include <meshtensor/kernels/fixed_point.hpp>
#include <meshtensor/kernels/simd.hpp>

#include "support/error_message.hpp"
#include "support/exact_sum_reference.hpp"
#include "support/spread_values.hpp"

namespace meshtensor::kernels {
namespace {

struct FieldWidths {
  int exponent_bits;
  int mantissa_bits;
};

FieldWidths widths(DType dtype) {
  switch (dtype) {
    case DType::f64:
      return {11, 52};
    case DType::f32:
      return {8, 23};
    case DType::bf16:
      return {8, 7};
    default:
      return {5, 10};
  }
}

std::uint64_t bits_at(const Tensor& tensor, std::int64_t i) {
  const std::size_t size = dtype_size(tensor.dtype());
  std::uint64_t pattern = 0;
  std::memcpy(&pattern, tensor.bytes().data() + static_cast<std::size_t>(i) * size, size);
  return pattern;
}

// The exact sum of `addends` through the kernels alone: max of the keys, encode, integer adds,
// decode. The order of the integer adds is reversed to show it does not matter.
Tensor fixed_point_sum(const std::vector<Tensor>& addends, std::int64_t divisor) {
  const std::int64_t n = addends[0].numel();
  const DType dtype = addends[0].dtype();
  const int limbs = fixed_point_format(dtype).limbs;
  Tensor keys = Tensor::zeros({n}, DType::u8);
  Tensor own_keys = Tensor::zeros({n}, DType::u8);
  for (const Tensor& addend : addends) {
    fixed_point_keys(addend, own_keys);
    auto all = keys.values<std::uint8_t>();
    auto own = own_keys.values<std::uint8_t>();
    for (std::int64_t i = 0; i < n; ++i)
      all[i] = std::max(all[i], own[i]);
  }
  Tensor total = Tensor::zeros({n * limbs}, DType::i64);
  Tensor fixed = Tensor::zeros({n * limbs}, DType::i64);
  for (auto it = addends.rbegin(); it != addends.rend(); ++it) {
    encode_fixed_point(*it, keys, fixed);
    auto sum = total.values<std::int64_t>();
    auto part = fixed.values<std::int64_t>();
    for (std::size_t i = 0; i < sum.size(); ++i)
      sum[i] += part[i];
  }
  Tensor result({n}, dtype);
  decode_fixed_point(total, keys, divisor, result);
  return result;
}

std::vector<Tensor> spread_addends(DType dtype, int k, std::int64_t count, int low_base,
                                   int high_base, int spread, std::uint64_t seed) {
  std::vector<Tensor> addends;
  for (int r = 0; r < k; ++r)
    addends.push_back(testing::spread_values(dtype, count, low_base, high_base, spread, seed, r));
  return addends;
}

void expect_correctly_rounded(const std::vector<Tensor>& addends, std::int64_t divisor) {
  const Tensor result = fixed_point_sum(addends, divisor);
  const FieldWidths w = widths(result.dtype());
  for (std::int64_t i = 0; i < result.numel(); ++i) {
    testing::ExactSumReference reference;
    for (const Tensor& addend : addends) {
      const std::int64_t at[] = {i};
      reference.add(addend.get(at));
    }
    ASSERT_EQ(bits_at(result, i), reference.rounded(w.exponent_bits, w.mantissa_bits,
                                                    static_cast<std::uint64_t>(divisor)))
        << dtype_name(result.dtype()) << " element " << i << " of " << addends.size()
        << " addends, divisor " << divisor;
  }
}

TEST(FixedPoint, SumsWithinTheExactRangeAreCorrectlyRounded) {
  // Spreads inside the documented exact range: f32 2^-24, bf16 2^-40, f64 2^-36 of the largest.
  struct Case {
    DType dtype;
    int low_base;
    int high_base;
    int spread;
  };
  const Case cases[] = {{DType::f32, -140, 100, 24},
                        {DType::f64, -1000, 980, 36},
                        {DType::bf16, -130, 80, 40},
                        {DType::f16, -24, -16, 30}};
  for (const Case& c : cases) {
    for (const int k : {1, 2, 3, 8, 64}) {
      expect_correctly_rounded(spread_addends(c.dtype, k, 500, c.low_base, c.high_base, c.spread,
                                              static_cast<std::uint64_t>(k) * 31),
                               1);
    }
  }
}

TEST(FixedPoint, AveragesAreTheCorrectlyRoundedQuotient) {
  for (const DType dtype : {DType::f32, DType::f64, DType::bf16, DType::f16}) {
    for (const int k : {2, 3, 6, 7, 40}) {
      expect_correctly_rounded(spread_addends(dtype, k, 300, -10, 10, 5, 99), k);
    }
  }
}

TEST(FixedPoint, EveryFloat16SumIsExact) {
  // f16's whole range fits the window: random finite patterns of any magnitude sum exactly.
  for (const int k : {2, 5, 33}) {
    std::vector<Tensor> addends;
    for (int j = 0; j < k; ++j) {
      Tensor t({2000}, DType::f16);
      auto v = t.values<Float16>();
      for (std::size_t i = 0; i < v.size(); ++i) {
        auto pattern = static_cast<std::uint16_t>(mix64(i * 131 + static_cast<std::uint64_t>(j)));
        if ((pattern & 0x7C00u) == 0x7C00u) pattern &= 0xBFFFu;  // keep it finite
        v[i] = Float16{pattern};
      }
      addends.push_back(t);
    }
    expect_correctly_rounded(addends, 1);
  }
}

// The documented anchor of an element: one above the top binade its scale key covers. f32 keys
// are binades; f64 keys are bins of 8 binades [8k + 8, 8k + 15] of the biased exponent, the
// lowest 16 binades sharing key 0 and the top bin holding the 7 finite binades left.
int documented_anchor(DType dtype, double largest_magnitude) {
  int exponent = 0;
  std::frexp(largest_magnitude, &exponent);  // |x| < 2^exponent: binade exponent - 1
  if (dtype == DType::f32) return exponent;
  const int biased = exponent - 1 + 1023;
  const int top = biased <= 15 ? 15 : std::min(((biased - 8) >> 3) * 8 + 15, 2046);
  return top - 1023 + 1;
}

// The documented promises, per dtype: addends within 2^-exact_bits of the largest add exactly;
// any other loses at most 2^-floor_bits of the largest, toward zero.
struct FloorPromise {
  DType dtype;
  int exact_bits;
  int floor_bits;
  int lowest_exponent;   // binade of the smallest subnormal
  int highest_exponent;  // binade of the largest finite value
};

// The exact sum of {L, -L, x} (three ranks) through reduce_exact and through keys/encode/decode.
std::pair<double, double> cancelled_sum(DType dtype, double large, double x) {
  std::vector<Tensor> addends = {Tensor::from_values({1}, dtype, std::vector<double>{large}),
                                 Tensor::from_values({1}, dtype, std::vector<double>{-large}),
                                 Tensor::from_values({1}, dtype, std::vector<double>{x})};
  std::vector<const std::byte*> inputs;
  for (const Tensor& addend : addends)
    inputs.push_back(addend.bytes().data());
  Tensor out({1}, dtype);
  std::byte* const output = out.bytes().data();
  reduce_exact(dtype, ReduceOp::sum, inputs, std::span<std::byte* const>(&output, 1), 1);
  const std::int64_t at[] = {0};
  return {out.get(at), fixed_point_sum(addends, 1).get(at)};
}

TEST(FixedPoint, TheDocumentedFloorHoldsForEveryBinadeOfTheLargestAddend) {
  // From the bottom key to the top key: L = 2^e, the tightest case for both bounds.
  const FloorPromise promises[] = {{DType::f64, 36, 88, -1074, 1023},
                                   {DType::f32, 24, 47, -149, 127},
                                   {DType::bf16, 40, 47, -133, 127},
                                   {DType::f16, 64, 200, -24, 15}};  // f16: always exact
  for (const FloorPromise& p : promises) {
    const FieldWidths w = widths(p.dtype);
    for (int e = p.lowest_exponent; e <= p.highest_exponent; ++e) {
      const double large = std::ldexp(1.0, e);
      const double all_ones = 2.0 - std::ldexp(1.0, -w.mantissa_bits);  // a full mantissa
      // Just inside the exact range, with every mantissa bit set; and deep below it.
      for (const int below : {p.exact_bits, p.exact_bits + 1, p.exact_bits + 17, p.floor_bits - 3,
                              p.floor_bits, p.floor_bits + 9}) {
        for (const double sign : {1.0, -1.0}) {
          const std::int64_t at[] = {0};
          // x as the dtype holds it (it may round or underflow near the bottom).
          const double x =
              Tensor::from_values({1}, p.dtype,
                                  std::vector<double>{sign * std::ldexp(all_ones, e - below)})
                  .get(at);
          const auto [got, through_limbs] = cancelled_sum(p.dtype, large, x);
          ASSERT_EQ(std::bit_cast<std::uint64_t>(got), std::bit_cast<std::uint64_t>(through_limbs))
              << dtype_name(p.dtype) << " e=" << e;
          const bool exact_range = std::fabs(x) >= std::ldexp(large, -p.exact_bits);
          if (exact_range || x == 0) {
            ASSERT_EQ(got, x) << dtype_name(p.dtype) << ": " << x << " next to 2^" << e
                              << " must add exactly";
            continue;
          }
          // Truncated toward zero, by at most 2^-floor_bits of L.
          ASSERT_LE(std::fabs(got), std::fabs(x)) << dtype_name(p.dtype) << " e=" << e;
          ASSERT_TRUE(got == 0 || std::signbit(got) == std::signbit(x));
          ASSERT_LE(std::fabs(x - got), std::ldexp(large, -p.floor_bits))
              << dtype_name(p.dtype) << ": " << x << " next to 2^" << e << " lost more than 2^-"
              << p.floor_bits << " of it";
        }
      }
    }
  }
}

TEST(FixedPoint, TopOfTheDoubleRangeKeepsTheFloor) {
  // 2^1009 and 2^973 (1 + 2^-52) are 36 binades apart: the small addend must survive whole.
  const double small = std::ldexp(1.0 + 0x1p-52, 973);
  const auto [got, through_limbs] = cancelled_sum(DType::f64, std::ldexp(1.0, 1009), small);
  EXPECT_EQ(std::bit_cast<std::uint64_t>(got), std::bit_cast<std::uint64_t>(small))
      << std::hexfloat << got;
  EXPECT_EQ(std::bit_cast<std::uint64_t>(through_limbs), std::bit_cast<std::uint64_t>(small));
}

TEST(FixedPoint, AddendsFarBelowTheLargestAreTruncatedAtTheDocumentedFloor) {
  // Each addend is truncated toward zero to a multiple of 2^(anchor - window). The reference
  // applies that truncation by hand and sums exactly.
  for (const DType dtype : {DType::f32, DType::f64}) {
    const int window = fixed_point_format(dtype).window_bits;
    // Per element: L, -L and a small addend s = L * 2^-k for every k up to past the window, plus
    // a spread of others. L and -L cancel, so what the floor removes from s shows in the result
    // instead of vanishing in its rounding.
    const std::int64_t n = window + 60;
    std::vector<Tensor> addends = spread_addends(dtype, 3, n, -30, -20, 4, 5);
    std::vector<double> large, small;
    for (std::int64_t i = 0; i < n; ++i) {
      const double mantissa =
          1.0 + static_cast<double>(mix64(static_cast<std::uint64_t>(i)) >> 11) * 0x1p-53;
      large.push_back(std::ldexp(1.75, 10));
      small.push_back(std::ldexp(mantissa, 10 - static_cast<int>(i)));
    }
    addends.push_back(Tensor::from_values({n}, dtype, small));
    addends.push_back(Tensor::from_values({n}, dtype, large));
    for (double& x : large)
      x = -x;
    addends.push_back(Tensor::from_values({n}, dtype, large));
    const Tensor result = fixed_point_sum(addends, 1);
    const FieldWidths w = widths(dtype);
    for (std::int64_t i = 0; i < result.numel(); ++i) {
      const std::int64_t at[] = {i};
      double largest = 0;
      for (const Tensor& addend : addends)
        largest = std::max(largest, std::fabs(addend.get(at)));
      const double unit = std::ldexp(1.0, documented_anchor(dtype, largest) - window);
      testing::ExactSumReference reference;
      for (const Tensor& addend : addends)
        reference.add(std::trunc(addend.get(at) / unit) * unit);
      ASSERT_EQ(bits_at(result, i), reference.rounded(w.exponent_bits, w.mantissa_bits))
          << dtype_name(dtype) << " element " << i;
    }
  }
}

// reduce_exact picks per block between a plain double sum, limbs carried in doubles and int64
// limbs, compiled for each SIMD level: every choice must give the limbs' bits. The data mixes
// blocks inside the exact range, blocks with addends far below their element's largest (so the
// window truncates), blocks with infinities and NaN, and counts that are not multiples of a
// block or a vector.
TEST(FixedPoint, ReduceExactGivesTheLimbsBitsOnEveryPathAndSimdLevel) {
  const SimdLevel saved = simd_level();
  for (const DType dtype : {DType::f32, DType::bf16, DType::f16, DType::f64}) {
    for (const int k : {1, 2, 3, 8, 31, 32, 33, 40}) {
      const std::int64_t count = 3 * 1024 + 77;
      std::vector<Tensor> addends;
      for (int r = 0; r < k; ++r) {
        Tensor narrow = testing::spread_values(dtype, count, -20, 20, 6, 17, r);
        const Tensor wide = testing::spread_values(dtype, count, -60, 60, 70, 18, r);
        // Block 1 spans 70 binades per element; block 2 holds a NaN and an infinity.
        narrow.narrow(0, 1024, 1024).copy_from(wide.narrow(0, 1024, 1024));
        if (r == k / 2) {
          const std::int64_t nan_at[] = {2048 + 5};
          const std::int64_t inf_at[] = {2048 + 900};
          narrow.set(nan_at, std::numeric_limits<double>::quiet_NaN());
          narrow.set(inf_at, std::numeric_limits<double>::infinity());
        }
        addends.push_back(std::move(narrow));
      }
      std::vector<const std::byte*> inputs;
      for (const Tensor& addend : addends)
        inputs.push_back(addend.bytes().data());
      for (const ReduceOp op : {ReduceOp::sum, ReduceOp::avg}) {
        const Tensor expected = fixed_point_sum(addends, op == ReduceOp::avg ? k : 1);
        for (const SimdLevel level : {SimdLevel::baseline, SimdLevel::avx2, SimdLevel::avx512}) {
          if (static_cast<int>(level) > static_cast<int>(best_simd_level())) continue;
          set_simd_level(level);
          Tensor out({count}, dtype);
          std::byte* const output = out.bytes().data();
          reduce_exact(dtype, op, inputs, std::span<std::byte* const>(&output, 1),
                       static_cast<std::size_t>(count));
          EXPECT_TRUE(out.bitwise_equal(expected))
              << dtype_name(dtype) << " k=" << k << " " << reduce_op_name(op) << " "
              << simd_level_name(level);
          // In place, every output one of the inputs (the threads backend's all_reduce): a
          // block whose fast path stops midway must still see its inputs whole.
          std::vector<Tensor> copies;
          std::vector<const std::byte*> copied_inputs;
          std::vector<std::byte*> copied_outputs;
          for (const Tensor& addend : addends) {
            copies.push_back(addend.clone());
            copied_inputs.push_back(copies.back().bytes().data());
            copied_outputs.push_back(copies.back().bytes().data());
          }
          reduce_exact(dtype, op, copied_inputs, copied_outputs, static_cast<std::size_t>(count));
          for (const Tensor& copy : copies) {
            EXPECT_TRUE(copy.bitwise_equal(expected))
                << "in place: " << dtype_name(dtype) << " k=" << k << " " << reduce_op_name(op)
                << " " << simd_level_name(level);
          }
        }
      }
    }
  }
  set_simd_level(saved);
}

TEST(FixedPoint, NonFiniteAddendsFollowIeeeWithoutOrder) {
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  // Per element: addends of three ranks and the expected sum.
  struct Case {
    double a, b, c, expected;
  };
  const Case cases[] = {{inf, 1.0, -5.0, inf},   {-inf, 1.0, 3.0, -inf}, {inf, -inf, 0.0, nan},
                        {nan, 1.0, 2.0, nan},    {inf, inf, 7.0, inf},   {1e38, 3e38, 0.0, inf},
                        {-0.0, -0.0, -0.0, 0.0}, {1.5, -1.5, 0.0, 0.0}};
  for (const DType dtype : {DType::f32, DType::f64, DType::bf16, DType::f16}) {
    std::vector<double> a, b, c;
    for (const Case& x : cases) {
      a.push_back(x.a);
      b.push_back(x.b);
      c.push_back(x.c);
    }
    const auto n = static_cast<std::int64_t>(a.size());
    const Tensor result =
        fixed_point_sum({Tensor::from_values({n}, dtype, a), Tensor::from_values({n}, dtype, b),
                         Tensor::from_values({n}, dtype, c)},
                        1);
    for (std::int64_t i = 0; i < n; ++i) {
      const std::int64_t at[] = {i};
      const double expected = cases[i].expected;
      const double got = result.get(at);
      if (dtype == DType::f64 && i == 5) continue;  // 4e38 is finite in f64
      if (std::isnan(expected)) {
        EXPECT_TRUE(std::isnan(got)) << dtype_name(dtype) << " case " << i;
        // The canonical quiet NaN: positive, payload zero.
        const Tensor canonical = Tensor::full({1}, dtype, nan);
        EXPECT_EQ(bits_at(result, i), bits_at(canonical, 0)) << dtype_name(dtype);
      } else if (dtype == DType::f16 && i == 5) {
        EXPECT_TRUE(std::isinf(got));  // already infinite on conversion
      } else {
        EXPECT_EQ(got, expected) << dtype_name(dtype) << " case " << i;
        EXPECT_EQ(std::signbit(got), std::signbit(expected)) << dtype_name(dtype) << " case " << i;
      }
    }
  }
}

TEST(FixedPoint, BadArgumentsAreNamed) {
  const Tensor values = Tensor::from_values({2}, DType::f32, std::vector<double>{1.0, 1e30});
  Tensor keys = Tensor::zeros({2}, DType::u8);
  Tensor fixed = Tensor::zeros({2}, DType::i64);
  EXPECT_NE(testing::error_message([&] {
              encode_fixed_point(values, keys, fixed);
            }).find("element 0 has scale key 0 below its own value's key 127"),
            std::string::npos);
  EXPECT_NE(testing::error_message([&] {
              fixed_point_keys(Tensor::zeros({2}, DType::i32), keys);
            }).find("not i32"),
            std::string::npos);
  EXPECT_NE(testing::error_message([&] {
              fixed_point_keys(values, Tensor::zeros({3}, DType::u8));
            }).find("keys holds 3 elements, expected 2"),
            std::string::npos);
  EXPECT_NE(testing::error_message([&] {
              decode_fixed_point(fixed, keys, 0, Tensor(values));
            }).find("divisor must be at least 1, not 0"),
            std::string::npos);
}

}  // namespace
}  // namespace meshtensor::kernels
