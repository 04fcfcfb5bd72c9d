#include <bit>
#include <cmath>

#include <gtest/gtest.h>

#include <meshtensor/core/random.hpp>
#include <meshtensor/core/tensor.hpp>

namespace meshtensor {
namespace {

TEST(Random, PortableLogIsAccurate) {
  for (std::uint64_t i = 1; i < 100000; ++i) {
    const double x = static_cast<double>(mix64(i) >> 11) * 0x1p-53 + 1e-300;
    const double error = std::fabs(portable_log(x) - std::log(x));
    ASSERT_LE(error, 4 * std::ldexp(1.0, std::ilogb(std::fabs(std::log(x))) - 52) + 1e-300) << x;
  }
  EXPECT_EQ(portable_log(1.0), 0.0);
}

TEST(Random, NormalSamplesHaveUnitMoments) {
  const int n = 200000;
  double sum = 0;
  double sum_squares = 0;
  int beyond_three_sigma = 0;
  for (int i = 0; i < n; ++i) {
    const double x = normal_sample(7, static_cast<std::uint64_t>(i));
    sum += x;
    sum_squares += x * x;
    beyond_three_sigma += std::fabs(x) > 3;
  }
  EXPECT_NEAR(sum / n, 0.0, 0.01);
  EXPECT_NEAR(sum_squares / n, 1.0, 0.015);
  EXPECT_NEAR(beyond_three_sigma / static_cast<double>(n), 0.0027, 0.0006);
}

// The bits of the generator are part of the contract (the same data on every platform and in
// every release): these values pin them.
TEST(Random, SamplesArePinnedAcrossPlatforms) {
  EXPECT_EQ(std::bit_cast<std::uint64_t>(normal_sample(0, 0)), 0x3fe2793f16c70603ull);
  EXPECT_EQ(std::bit_cast<std::uint64_t>(normal_sample(12345, 678)), 0xbfedc975f7b2bb9aull);
  EXPECT_EQ(Tensor::random_normal({64, 33}, DType::f32, 2024).digest(), 0xc61c814538e27bbdull);
  EXPECT_EQ(uniform_int_sample(5, 9, -3, 3), 3);
}

TEST(Random, UniformIntsStayInRangeAndCoverIt) {
  int seen[7] = {};
  for (std::uint64_t i = 0; i < 7000; ++i) {
    const std::int64_t v = uniform_int_sample(1, i, -3, 3);
    ASSERT_GE(v, -3);
    ASSERT_LE(v, 3);
    ++seen[v + 3];
  }
  for (int count : seen)
    EXPECT_GT(count, 800);
  EXPECT_THROW(uniform_int_sample(1, 0, 3, 2), InvalidArgument);
}

}  // namespace
}  // namespace meshtensor
