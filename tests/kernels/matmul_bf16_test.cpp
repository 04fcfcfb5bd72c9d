#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <meshtensor/core/half.hpp>
#include <meshtensor/kernels/matmul.hpp>
#include <meshtensor/kernels/simd.hpp>

namespace meshtensor::kernels {
namespace {

using T = Transpose;

float from_bits(std::uint16_t bits) {
  return std::bit_cast<float>(std::uint32_t{bits} << 16);
}

/// Subnormals become the zero of their sign.
float flush(float x) {
  return std::fabs(x) < std::numeric_limits<float>::min() ? std::copysign(0.0f, x) : x;
}

/// The documented chain of one element, written out plainly: pairs of k (the odd one padded
/// with +0), the higher index first, each step one fma, flushed.
float chain(const std::vector<float>& a, const std::vector<float>& b, float start) {
  float acc = a.empty() ? start : flush(start);
  for (std::size_t k = 0; k < a.size(); k += 2) {
    const float a1 = k + 1 < a.size() ? flush(a[k + 1]) : 0.0f;
    const float b1 = k + 1 < a.size() ? flush(b[k + 1]) : 0.0f;
    acc = flush(std::fma(a1, b1, acc));
    acc = flush(std::fma(flush(a[k]), flush(b[k]), acc));
  }
  return acc;
}

/// bf16 values with exponents over the whole range (subnormals, products that underflow,
/// sums that cancel), signed zeros among them.
Tensor spread_bf16(std::int64_t rows, std::int64_t cols, std::uint64_t seed) {
  Tensor t(Shape{rows, cols}, DType::bf16);
  auto* bits = reinterpret_cast<std::uint16_t*>(t.bytes().data());
  std::uint64_t state = seed * 0x9E3779B97F4A7C15ULL + 1;
  for (std::int64_t i = 0; i < rows * cols; ++i) {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    const auto mantissa = static_cast<std::uint16_t>(state & 0x807FU);
    const std::uint64_t pick = (state >> 20) % 8;
    // Most values near 1 (so chains cancel and round), some tiny, some subnormal, some zero.
    const std::uint64_t exponent = pick < 5   ? 110 + (state >> 32) % 35
                                   : pick < 7 ? (state >> 32) % 90
                                              : 0;
    bits[i] = static_cast<std::uint16_t>(mantissa | (exponent << 7));
  }
  return t;
}

float element(const Tensor& t, std::int64_t r, std::int64_t c, bool transposed) {
  const auto* bits = reinterpret_cast<const std::uint16_t*>(t.bytes().data());
  const std::int64_t cols = t.shape()[1];
  return from_bits(transposed ? bits[c * cols + r] : bits[r * cols + c]);
}

class Bf16Matmul : public ::testing::Test {
 protected:
  void TearDown() override {
    set_simd_level(best_simd_level());
    allow_bf16_dot_products(true);
  }
  /// Every path: each SIMD level this CPU runs, and at avx512 the emulation beside the
  /// instruction (the second entry with `emulate`).
  struct Path {
    SimdLevel level;
    bool emulate;
  };
  static std::vector<Path> paths() {
    std::vector<Path> out;
    for (auto level : {SimdLevel::baseline, SimdLevel::avx2, SimdLevel::avx512})
      if (static_cast<int>(level) <= static_cast<int>(best_simd_level()))
        out.push_back({level, false});
    if (best_simd_level() == SimdLevel::avx512) out.push_back({SimdLevel::avx512, true});
    return out;
  }
  static std::string use(Path path) {
    set_simd_level(path.level);
    allow_bf16_dot_products(!path.emulate);
    return fmt::format("{}{}", simd_level_name(path.level), path.emulate ? " emulated" : "");
  }
};

TEST_F(Bf16Matmul, EveryElementIsThePairedChainAtEveryLevel) {
  // Odd and even k, several blocks of k (256 per block), edge tiles, every operand form, starts
  // from +0, a bias and the output (subnormal starts among them).
  for (const auto& [m, n, k] : {std::tuple{1, 1, 1}, std::tuple{9, 37, 300},
                                std::tuple{30, 70, 517}, std::tuple{97, 33, 2}}) {
    for (const bool ta : {false, true}) {
      for (const bool tb : {false, true}) {
        const Tensor a = spread_bf16(ta ? k : m, ta ? m : k, 1);
        const Tensor b = spread_bf16(tb ? n : k, tb ? k : n, 2);
        Tensor start(Shape{m, n}, DType::f32);
        auto s = start.values<float>();
        for (std::size_t i = 0; i < s.size(); ++i)
          s[i] = i % 3 == 0 ? std::ldexp(static_cast<float>(i % 7) - 3.0f, -128)
                            : static_cast<float>(i % 11) - 5.0f;
        for (const Path path : paths()) {
          const std::string where = use(path);
          Tensor c = start.clone();
          matmul(a, ta ? T::yes : T::no, b, tb ? T::yes : T::no, c, /*accumulate=*/true);
          const auto got = c.values<float>();
          for (std::int64_t i = 0; i < m; ++i) {
            for (std::int64_t j = 0; j < n; ++j) {
              std::vector<float> row(static_cast<std::size_t>(k));
              std::vector<float> column(static_cast<std::size_t>(k));
              for (std::int64_t x = 0; x < k; ++x) {
                row[static_cast<std::size_t>(x)] = element(a, i, x, ta);
                column[static_cast<std::size_t>(x)] = element(b, x, j, tb);
              }
              const float expected = chain(row, column, s[static_cast<std::size_t>(i * n + j)]);
              const float actual = got[static_cast<std::size_t>(i * n + j)];
              ASSERT_EQ(std::bit_cast<std::uint32_t>(actual),
                        std::bit_cast<std::uint32_t>(expected))
                  << fmt::format("{}x{}x{} ta {} tb {} {} at ({}, {}): {} vs {}", m, n, k, ta, tb,
                                 where, i, j, actual, expected);
            }
          }
        }
      }
    }
  }
}

TEST_F(Bf16Matmul, TheOrderWithinAPairIsTheHigherIndexFirst) {
  // From 2^24 with a = [1, -2^24], b = [1, 1]: the higher index first gives 2^24 - 2^24 = 0, then
  // 0 + 1 = 1; the lower first would give 2^24 + 1, a tie that rounds to 2^24, then 0.
  Tensor a(Shape{1, 2}, DType::bf16);
  Tensor b(Shape{2, 1}, DType::bf16);
  auto* ab = reinterpret_cast<std::uint16_t*>(a.bytes().data());
  auto* bb = reinterpret_cast<std::uint16_t*>(b.bytes().data());
  ab[0] = 0x3F80;  // 1
  ab[1] = 0xCB80;  // -2^24
  bb[0] = 0x3F80;
  bb[1] = 0x3F80;
  for (const Path path : paths()) {
    const std::string where = use(path);
    Tensor c(Shape{1, 1}, DType::f32);
    c.values<float>()[0] = 0x1p24f;
    matmul(a, T::no, b, T::no, c, /*accumulate=*/true);
    EXPECT_EQ(c.values<float>()[0], 1.0f) << where;
  }
}

TEST_F(Bf16Matmul, TheInstructionRunsOnlyAtTheAvx512LevelWhenAllowed) {
  // A cap below avx512 (MESHTENSOR_SIMD) times the emulation, as on a CPU without it.
  for (const Path path : paths()) {
    const std::string where = use(path);
    if (path.level != SimdLevel::avx512 || path.emulate) {
      EXPECT_FALSE(bf16_dot_products_used()) << where;
    }
  }
}

}  // namespace
}  // namespace meshtensor::kernels
