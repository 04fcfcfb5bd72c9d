// The pieces of the Llama family's kernels: portable elementary functions, rotary embeddings and
// the SwiGLU gate.
#include <bit>
#include <cmath>
#include <cstdint>
#include <vector>

#include <gtest/gtest.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/kernels/activation.hpp>
#include <meshtensor/kernels/portable_math.hpp>
#include <meshtensor/kernels/rotary.hpp>
#include <meshtensor/kernels/simd.hpp>

namespace meshtensor::kernels {
namespace {

/// |a - b| in units of b's last place.
double ulps(double a, double b) {
  return std::abs(a - b) / std::abs(std::nextafter(b, INFINITY) - b);
}

TEST(PortableMath, WithinAFewUlpOfTheCLibrary) {
  double worst_sin = 0;
  double worst_cos = 0;
  for (int i = -20000; i <= 20000; ++i) {
    const double x = i * 0.4123;  // up to about 8,000 radians: a long context's angles
    const double s = std::sin(x);
    const double c = std::cos(x);
    // Near a zero an ulp is tiny: measure against the magnitude of the other function there.
    worst_sin = std::max(worst_sin, std::abs(portable_sin(x) - s) / std::max(std::abs(s), 1e-3));
    worst_cos = std::max(worst_cos, std::abs(portable_cos(x) - c) / std::max(std::abs(c), 1e-3));
  }
  EXPECT_LT(worst_sin, 1e-13);
  EXPECT_LT(worst_cos, 1e-13);
  for (const double x : {-700.0, -20.5, -1.0, -1e-9, 0.0, 0.3, 1.0, 2.5, 88.0, 700.0})
    EXPECT_LE(ulps(portable_exp(x), std::exp(x)), 4) << x;
  for (const double x : {1e-300, 1e-5, 0.5, 0.99, 1.0, 1.5, 10000.0, 500000.0, 1e300})
    EXPECT_LE(ulps(portable_log(x), std::log(x)), 4) << x;
  EXPECT_EQ(portable_log(1.0), 0.0);
  EXPECT_EQ(portable_exp(0.0), 1.0);
}

// The loss's exp: within 2 ulps of the C library's over the softmax's range, and every edge of
// IEEE arithmetic defined (the values a diverged model's logits reach).
TEST(PortableMath, FastExpIsAccurateAndDefinedEverywhere) {
  double worst = 0;
  for (int i = 0; i <= 200000; ++i) {
    const double x = -708.0 + 1417.0 * static_cast<double>(i) / 200000.0;  // normal results
    worst = std::max(worst, ulps(exp_f64(x), std::exp(x)));
  }
  EXPECT_LE(worst, 2);
  for (int i = 0; i <= 100000; ++i) {  // the softmax's usual range, finely
    const double x = -40.0 * static_cast<double>(i) / 100000.0;
    EXPECT_LE(ulps(exp_f64(x), std::exp(x)), 2) << x;
  }
  EXPECT_EQ(exp_f64(0.0), 1.0);
  EXPECT_EQ(exp_f64(-HUGE_VAL), 0.0);
  EXPECT_EQ(exp_f64(-1e300), 0.0);
  EXPECT_EQ(exp_f64(-746.0), 0.0);
  EXPECT_GT(exp_f64(-744.0), 0.0);  // subnormal
  EXPECT_EQ(exp_f64(HUGE_VAL), HUGE_VAL);
  EXPECT_EQ(exp_f64(710.0), HUGE_VAL);
  EXPECT_TRUE(std::isnan(exp_f64(std::nan(""))));
}

// The vectorised exp (the loss's): exp_f64's bits for every value, edges included, at every
// SIMD level and for counts that leave a vector's tail.
TEST(PortableMath, VectorisedExpHasTheScalarBitsAtEveryLevel) {
  std::vector<double> x;
  for (int i = 0; i <= 30011; ++i)
    x.push_back(-800.0 + 1600.0 * static_cast<double>(i) / 30011.0);
  for (const double edge : {0.0,          -0.0,   709.782712893384, 709.7827128933841,
                            709.79,       -745.2, -745.19999999,    -745.20000001,
                            -744.5,       -708.4, 1e-300,           -1e-300,
                            1e300,        -1e300, HUGE_VAL,         -HUGE_VAL,
                            std::nan(""), 0x1p51, -0x1p51,          0x1p60})
    x.push_back(edge);
  for (auto level : {SimdLevel::baseline, SimdLevel::avx2, SimdLevel::avx512}) {
    if (static_cast<int>(level) > static_cast<int>(best_simd_level())) continue;
    set_simd_level(level);
    for (const std::size_t count : {x.size(), std::size_t{7}, std::size_t{1}}) {
      std::vector<double> out(count);
      exp_f64_values(x.data() + (x.size() - count), out.data(), static_cast<std::int64_t>(count));
      for (std::size_t i = 0; i < count; ++i) {
        const double want = exp_f64(x[x.size() - count + i]);
        ASSERT_EQ(std::bit_cast<std::uint64_t>(out[i]), std::bit_cast<std::uint64_t>(want))
            << "level " << static_cast<int>(level) << ", x = " << x[x.size() - count + i];
      }
    }
  }
  set_simd_level(best_simd_level());
}

TEST(Rotary, TablesFollowTheEquationsAndRefuseBadShapes) {
  const RotaryTable table = rotary_table(8, 64, 10000.0);
  ASSERT_EQ(table.cos.size(), 64u * 4);
  for (std::int64_t i = 0; i < 4; ++i) {
    EXPECT_EQ(table.cos[static_cast<std::size_t>(i)], 1.0f);  // position 0: no turn
    EXPECT_EQ(table.sin[static_cast<std::size_t>(i)], 0.0f);
  }
  for (std::int64_t p : {1, 17, 63}) {
    for (std::int64_t i = 0; i < 4; ++i) {
      const double angle =
          static_cast<double>(p) * std::pow(10000.0, -2.0 * static_cast<double>(i) / 8.0);
      EXPECT_NEAR(table.cos[static_cast<std::size_t>(p * 4 + i)], std::cos(angle), 1e-7);
      EXPECT_NEAR(table.sin[static_cast<std::size_t>(p * 4 + i)], std::sin(angle), 1e-7);
    }
  }
  EXPECT_THROW(rotary_table(7, 8, 10000.0), InvalidArgument);
  EXPECT_THROW(rotary_table(8, 8, 1.0), InvalidArgument);
  EXPECT_THROW(rotary_table(8, 0, 10000.0), InvalidArgument);
}

/// transformers' _compute_llama3_parameters and linear scaling, written out in double.
TEST(Rotary, ScalingsRescaleFrequenciesAsTransformersDoes) {
  const double theta = 500000.0;
  const std::int64_t hd = 64;
  const RotaryScaling llama3{RotaryScaling::Kind::llama3, 32.0, 1.0, 4.0, 8192};
  const std::vector<double> plain = rotary_frequencies(hd, theta, {});
  const std::vector<double> scaled = rotary_frequencies(hd, theta, llama3);
  int low = 0, high = 0, medium = 0;
  for (std::size_t i = 0; i < plain.size(); ++i) {
    EXPECT_NEAR(plain[i], std::pow(theta, -2.0 * static_cast<double>(i) / hd), 1e-15 * plain[0]);
    const double wavelength = 2 * M_PI / plain[i];
    double expected = plain[i];
    if (wavelength > 8192.0) {
      expected = plain[i] / 32.0;
      ++low;
    } else if (wavelength >= 2048.0) {
      const double smooth = (8192.0 / wavelength - 1.0) / 3.0;
      expected = (1 - smooth) * plain[i] / 32.0 + smooth * plain[i];
      ++medium;
    } else {
      ++high;
    }
    EXPECT_NEAR(scaled[i], expected, 1e-12 * expected) << i;
  }
  EXPECT_TRUE(low > 0 && medium > 0 && high > 0) << low << " " << medium << " " << high;
  const std::vector<double> linear =
      rotary_frequencies(hd, theta, {RotaryScaling::Kind::linear, 4.0});
  EXPECT_EQ(linear[3], plain[3] / 4.0);
  EXPECT_THROW(rotary_frequencies(hd, theta, {RotaryScaling::Kind::llama3, 8.0, 4.0, 1.0, 8192}),
               InvalidArgument);
  // The table is shared while held, and is the unscaled one's for no scaling.
  const auto a = shared_rotary_table(8, 16, theta, llama3);
  EXPECT_EQ(a, shared_rotary_table(8, 16, theta, llama3));
  EXPECT_EQ(shared_rotary_table(8, 16, theta)->cos, rotary_table(8, 16, theta).cos);
  EXPECT_NE(a->cos, rotary_table(8, 16, theta).cos);
}

TEST(Rotary, TurnsEachHalfPairAndBackwardIsTheInverse) {
  const RotaryTable table = rotary_table(4, 16, 500.0);
  // Two rows of two heads of 4: (x1, x2) pairs are (v[0], v[2]) and (v[1], v[3]).
  std::vector<float> x = {1, 2, 3, 4, -1, 0.5f, 2, -3, 0.25f, 1, -2, 4, 3, 3, 3, 3};
  const std::vector<float> original = x;
  const std::int64_t positions[] = {5, 11};
  rotary_forward(x.data(), 2, 2, positions, table);
  for (std::int64_t r = 0; r < 2; ++r) {
    const std::int64_t p = positions[r];
    for (std::int64_t h = 0; h < 2; ++h) {
      for (std::int64_t i = 0; i < 2; ++i) {
        const std::size_t a = static_cast<std::size_t>(r * 8 + h * 4 + i);
        const float c = table.cos[static_cast<std::size_t>(p * 2 + i)];
        const float s = table.sin[static_cast<std::size_t>(p * 2 + i)];
        EXPECT_EQ(x[a], original[a] * c + -original[a + 2] * s);
        EXPECT_EQ(x[a + 2], original[a + 2] * c + original[a] * s);
      }
    }
  }
  rotary_backward(x.data(), 2, 2, positions, table);
  for (std::size_t i = 0; i < x.size(); ++i)
    EXPECT_NEAR(x[i], original[i], 1e-6) << i;
  const std::int64_t outside[] = {16};
  EXPECT_THROW(rotary_forward(x.data(), 1, 2, outside, table), InvalidArgument);
}

TEST(Rotary, AttentionScoresDependOnTheDistanceOnly) {
  const RotaryTable table = rotary_table(8, 128, 10000.0);
  const std::vector<float> q0 = {0.3f, -1.2f, 0.8f, 2.0f, -0.5f, 0.1f, 1.5f, -0.7f};
  const std::vector<float> k0 = {1.1f, 0.4f, -0.9f, 0.2f, 0.6f, -1.3f, 0.05f, 0.9f};
  const auto score = [&](std::int64_t pq, std::int64_t pk) {
    std::vector<float> q = q0;
    std::vector<float> k = k0;
    rotary_forward(q.data(), 1, 1, &pq, table);
    rotary_forward(k.data(), 1, 1, &pk, table);
    double dot = 0;
    for (std::size_t i = 0; i < q.size(); ++i)
      dot += static_cast<double>(q[i]) * k[i];
    return dot;
  };
  EXPECT_NEAR(score(10, 3), score(107, 100), 1e-5);
  EXPECT_NEAR(score(40, 40), score(0, 0), 1e-5);
}

TEST(SwiGlu, MatchesTheEquationsAndItsDerivative) {
  std::vector<float> gate;
  std::vector<float> up;
  for (int i = -40; i <= 40; ++i) {
    gate.push_back(static_cast<float>(i) * 0.37f);
    up.push_back(1.0f - static_cast<float>(i) * 0.05f);
  }
  const auto n = static_cast<std::int64_t>(gate.size());
  std::vector<float> y(gate.size());
  std::vector<float> dy(gate.size(), 1.0f);
  std::vector<float> d_gate(gate.size());
  std::vector<float> d_up(gate.size());
  swiglu_forward(gate.data(), up.data(), y.data(), n);
  swiglu_backward(gate.data(), up.data(), dy.data(), d_gate.data(), d_up.data(), n);
  for (std::size_t i = 0; i < gate.size(); ++i) {
    const double g = gate[i];
    const double sigma = 1.0 / (1.0 + std::exp(-g));
    const double silu = g * sigma;
    EXPECT_NEAR(y[i], silu * up[i], 1e-5 * (1 + std::abs(silu * up[i]))) << g;
    EXPECT_NEAR(d_up[i], silu, 1e-5 * (1 + std::abs(silu))) << g;
    const double derivative = sigma * (1 + g * (1 - sigma));
    EXPECT_NEAR(d_gate[i], up[i] * derivative, 1e-5 * (1 + std::abs(up[i] * derivative))) << g;
  }
  const float nan = std::nanf("");
  float out = 0;
  swiglu_forward(&nan, up.data(), &out, 1);
  EXPECT_TRUE(std::isnan(out));
}

TEST(SwiGlu, EverySimdLevelGivesTheSameBits) {
  std::vector<float> gate(333);
  std::vector<float> up(333);
  for (std::size_t i = 0; i < gate.size(); ++i) {
    gate[i] = std::sin(static_cast<float>(i)) * 9.0f;
    up[i] = std::cos(static_cast<float>(i) * 0.7f) * 3.0f;
  }
  std::vector<std::vector<std::uint32_t>> results;
  for (auto level : {SimdLevel::baseline, SimdLevel::avx2, SimdLevel::avx512}) {
    if (static_cast<int>(level) > static_cast<int>(best_simd_level())) continue;
    set_simd_level(level);
    std::vector<float> y(gate.size());
    std::vector<float> d_gate(gate.size());
    std::vector<float> d_up(gate.size());
    swiglu_forward(gate.data(), up.data(), y.data(), static_cast<std::int64_t>(y.size()));
    swiglu_backward(gate.data(), up.data(), up.data(), d_gate.data(), d_up.data(),
                    static_cast<std::int64_t>(y.size()));
    std::vector<std::uint32_t> bits;
    for (const auto* v : {&y, &d_gate, &d_up})
      for (const float f : *v)
        bits.push_back(std::bit_cast<std::uint32_t>(f));
    results.push_back(bits);
  }
  set_simd_level(best_simd_level());
  for (const auto& r : results)
    EXPECT_EQ(r, results.front());
}

}  // namespace
}  // namespace meshtensor::kernels
