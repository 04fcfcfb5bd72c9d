#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include <gtest/gtest.h>
#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

#include <meshtensor/core/half.hpp>
#include <meshtensor/core/random.hpp>

namespace meshtensor {
namespace {

// Reference rounding by search: positive finite patterns of a binary format increase with their
// value, so the correctly rounded result of |x| is one of the two patterns around it. Ties go to
// the even pattern; the pattern after the largest finite one stands for 2^(emax+1), i.e.
// infinity, as IEEE overflow under round-to-nearest-even prescribes.
class NearestReference {
 public:
  NearestReference(int exponent_bits, int mantissa_bits)
      : exponent_bits_(exponent_bits), mantissa_bits_(mantissa_bits) {
    const std::uint64_t infinity = ((std::uint64_t{1} << exponent_bits) - 1) << mantissa_bits;
    for (std::uint64_t p = 0; p < infinity; ++p)
      values_.push_back(decode_format(p, exponent_bits, mantissa_bits));
    const int bias = (1 << (exponent_bits - 1)) - 1;
    values_.push_back(std::ldexp(1.0, bias + 1));  // "value" of the infinity pattern
  }

  std::uint64_t round(double x) const {
    const std::uint64_t sign =
        std::signbit(x) ? std::uint64_t{1} << (exponent_bits_ + mantissa_bits_) : 0;
    const double magnitude = std::fabs(x);
    const std::uint64_t infinity = values_.size() - 1;
    if (magnitude >= values_.back()) return sign | infinity;
    // Largest pattern whose value is <= magnitude.
    std::uint64_t low = 0;
    std::uint64_t high = infinity;
    while (high - low > 1) {
      const std::uint64_t mid = (low + high) / 2;
      (values_[mid] <= magnitude ? low : high) = mid;
    }
    const double below = magnitude - values_[low];
    const double above = values_[high] - magnitude;  // exact: both are close in binary64
    if (below < above) return sign | low;
    if (above < below) return sign | high;
    return sign | ((low & 1) == 0 ? low : high);
  }

 private:
  int exponent_bits_;
  int mantissa_bits_;
  std::vector<double> values_;
};

std::uint32_t float_bits(float value) {
  return std::bit_cast<std::uint32_t>(value);
}

// f32 inputs for a sweep: every combination of the upper 20 bits (sign, exponent and the top 11
// mantissa bits, which covers each f16 rounding position in the normal range and the guard bit)
// with low-bit patterns that sit on, just below and just above halfway and at the extremes.
template <class Check>
void sweep_f32_classes(Check check) {
  const std::uint32_t low_patterns[] = {0x000, 0x001, 0x7FF, 0x800, 0x801, 0xFFF, 0x5A3};
  for (std::uint32_t upper = 0; upper < (1u << 20); ++upper) {
    for (std::uint32_t low : low_patterns)
      check(std::bit_cast<float>((upper << 12) | low));
  }
}

TEST(HalfConversion, GenericRoundingMatchesHardwareDoubleToFloat) {
  // The generic routine with binary32's field widths must agree with the CPU's conversion.
  std::vector<double> inputs = {0.0,
                                -0.0,
                                1.0,
                                -1.0,
                                0x1p-149,
                                0x1p-150,
                                0x1.8p-150,
                                0x1p-151,
                                0x1.fffffep127,
                                0x1.fffffefffffffp127,
                                0x1.ffffffp127,
                                1e300,
                                -1e300,
                                0x1.000001p0,
                                0x1.0000010000001p0,
                                0x1.0000030p0,
                                std::numeric_limits<double>::infinity(),
                                5e-324};
  for (std::uint64_t i = 0; i < 200000; ++i) {
    const std::uint64_t bits = mix64(i);
    inputs.push_back(std::bit_cast<double>(bits));
    // Concentrate on the binary32 exponent range, with ties and near-ties.
    const std::uint64_t exponent = 1023 - 160 + (bits % 300);
    const std::uint64_t mantissa =
        (mix64(bits) & ((1ull << 52) - 1)) & ~((i & 1) ? 0x0FFFFFFFull : 0ull);
    inputs.push_back(std::bit_cast<double>((bits & (1ull << 63)) | (exponent << 52) | mantissa));
  }
  for (double x : inputs) {
    if (std::isnan(x)) continue;
    EXPECT_EQ(round_double_to_format(x, 8, 23), float_bits(static_cast<float>(x)))
        << std::hexfloat << x;
  }
}

TEST(RoundToFormat, Binary64FieldsReproduceEveryDouble) {
  // Decomposing a double into significand and exponent and rounding it back with binary64's
  // widths is the identity, subnormals included.
  for (std::uint64_t i = 0; i < 200000; ++i) {
    std::uint64_t bits = mix64(i);
    if (i % 4 == 0) bits &= 0x800FFFFFFFFFFFFFull;  // subnormals and zeros
    const double x = std::bit_cast<double>(bits);
    if (!std::isfinite(x)) continue;
    int exponent = 0;
    const double fraction = std::frexp(std::fabs(x), &exponent);
    const auto significand = static_cast<std::uint64_t>(std::ldexp(fraction, 64 - 11));
    EXPECT_EQ(round_to_format(std::signbit(x), significand, exponent - 53, false, 11, 52), bits)
        << std::hexfloat << x;
  }
}

TEST(RoundToFormat, StickyBitActsLikeAnyValueStrictlyInside) {
  // With `sticky` the magnitude lies strictly between s*2^e and (s+1)*2^e. For s < 2^52 the
  // midpoint (2s+1)*2^(e-1) is a double, and the CPU's double->float conversion of it is the
  // reference for binary32.
  for (std::uint64_t i = 0; i < 300000; ++i) {
    const std::uint64_t r = mix64(i + 77);
    const std::uint64_t significand = (r >> 12) | 1;
    const int exponent = -200 + static_cast<int>(mix64(r) % 380);
    const double inside = std::ldexp(static_cast<double>(2 * significand + 1), exponent - 1);
    if (!std::isfinite(inside)) continue;
    EXPECT_EQ(round_to_format(false, significand, exponent, true, 8, 23),
              float_bits(static_cast<float>(inside)))
        << significand << " * 2^" << exponent;
  }
  // Exact ties resolve by the sticky bit: 1 + 2^-24 is a tie in binary32, anything above rounds up.
  EXPECT_EQ(round_to_format(false, (1ull << 24) + 1, -24, false, 8, 23), float_bits(1.0f));
  EXPECT_EQ(round_to_format(false, (1ull << 24) + 1, -24, true, 8, 23), float_bits(0x1.000002p0f));
  EXPECT_EQ(round_to_format(true, 0, 0, false, 8, 23), float_bits(-0.0f));
}

TEST(HalfConversion, Float16ToFloatIsExactForAllPatterns) {
  for (std::uint32_t p = 0; p < 65536; ++p) {
    const float value = to_float(Float16{static_cast<std::uint16_t>(p)});
    const double reference = decode_format(p, 5, 10);
    if (std::isnan(reference)) {
      ASSERT_TRUE(std::isnan(value)) << p;
      EXPECT_EQ(float_bits(value) >> 31, p >> 15);
      EXPECT_EQ((float_bits(value) >> 13) & 0x3FF, p & 0x3FF) << "payload kept";
    } else {
      ASSERT_EQ(float_bits(value), float_bits(static_cast<float>(reference))) << std::hex << p;
    }
  }
}

TEST(HalfConversion, BFloat16ToFloatIsExactForAllPatterns) {
  for (std::uint32_t p = 0; p < 65536; ++p) {
    const float value = to_float(BFloat16{static_cast<std::uint16_t>(p)});
    const double reference = decode_format(p, 8, 7);
    if (std::isnan(reference)) {
      ASSERT_TRUE(std::isnan(value)) << p;
    } else {
      ASSERT_EQ(float_bits(value), float_bits(static_cast<float>(reference))) << std::hex << p;
    }
  }
}

TEST(HalfConversion, EveryFloat16RoundTripsThroughFloat) {
  for (std::uint32_t p = 0; p < 65536; ++p) {
    const Float16 h{static_cast<std::uint16_t>(p)};
    const Float16 back = to_float16(to_float(h));
    if ((p & 0x7C00) == 0x7C00 && (p & 0x3FF) != 0) {
      EXPECT_EQ(back.bits, p | 0x200) << "NaN keeps sign and payload and becomes quiet";
    } else {
      ASSERT_EQ(back.bits, p) << std::hex << p;
    }
  }
}

TEST(HalfConversion, EveryBFloat16RoundTripsThroughFloat) {
  for (std::uint32_t p = 0; p < 65536; ++p) {
    const BFloat16 h{static_cast<std::uint16_t>(p)};
    const BFloat16 back = to_bfloat16(to_float(h));
    const BFloat16 back_from_double = to_bfloat16(static_cast<double>(to_float(h)));
    if ((p & 0x7F80) == 0x7F80 && (p & 0x7F) != 0) {
      EXPECT_EQ(back.bits, p | 0x40);
      EXPECT_EQ(back_from_double.bits, p | 0x40);
    } else {
      ASSERT_EQ(back.bits, p) << std::hex << p;
      ASSERT_EQ(back_from_double.bits, p) << std::hex << p;
    }
  }
}

TEST(HalfConversion, FloatToFloat16MatchesNearestEvenAcrossBitClasses) {
  const NearestReference reference(5, 10);
  std::uint64_t mismatches = 0;
  sweep_f32_classes([&](float x) {
    if (std::isnan(x)) {
      const Float16 h = to_float16(x);
      if ((h.bits & 0x7E00) != 0x7E00) ++mismatches;  // quiet NaN expected
      return;
    }
    if (to_float16(x).bits != reference.round(x)) ++mismatches;
    if (to_float16(static_cast<double>(x)).bits != reference.round(x)) ++mismatches;
  });
  EXPECT_EQ(mismatches, 0u);
}

TEST(HalfConversion, FloatToBFloat16MatchesNearestEvenAcrossBitClasses) {
  const NearestReference reference(8, 7);
  std::uint64_t mismatches = 0;
  // Every bf16 pattern as the upper half, with the rounding-relevant lower halves.
  const std::uint32_t low_patterns[] = {0x0000, 0x0001, 0x7FFF, 0x8000, 0x8001, 0xFFFF, 0x3C5A};
  for (std::uint32_t upper = 0; upper < 65536; ++upper) {
    for (std::uint32_t low : low_patterns) {
      const float x = std::bit_cast<float>((upper << 16) | low);
      const BFloat16 fast = to_bfloat16(x);
      const BFloat16 generic = to_bfloat16(static_cast<double>(x));
      if (std::isnan(x)) {
        if ((fast.bits & 0x7FC0) != 0x7FC0 || fast != generic) ++mismatches;
        continue;
      }
      if (fast.bits != reference.round(x) || generic.bits != reference.round(x)) ++mismatches;
    }
  }
  EXPECT_EQ(mismatches, 0u);
}

TEST(HalfConversion, NamedClassesRoundAsIeeeSays) {
  // Overflow: 65520 is halfway between f16 max (65504) and 2^16 and ties to even: infinity.
  EXPECT_EQ(to_float16(65504.0f).bits, 0x7BFF);
  EXPECT_EQ(to_float16(65519.0f).bits, 0x7BFF);
  EXPECT_EQ(to_float16(65520.0f).bits, 0x7C00);
  EXPECT_EQ(to_float16(-1e10f).bits, 0xFC00);
  // Subnormals: 2^-24 is the smallest; half of it ties to even (zero), just above rounds up.
  EXPECT_EQ(to_float16(0x1p-24f).bits, 0x0001);
  EXPECT_EQ(to_float16(0x1p-25f).bits, 0x0000);
  EXPECT_EQ(to_float16(0x1.000002p-25f).bits, 0x0001);
  EXPECT_EQ(to_float16(0x1.8p-24f).bits, 0x0002);  // 1.5 ulp ties to even (2)
  EXPECT_EQ(to_float16(-0x1p-26f).bits, 0x8000);   // signed zero kept
  // Largest subnormal rounds up into the smallest normal.
  EXPECT_EQ(to_float16(0x1.ffep-15f).bits, 0x0400);
  // bf16: ties to even at the 8-bit boundary; overflow to infinity.
  EXPECT_EQ(to_bfloat16(std::bit_cast<float>(0x3F808000u)).bits, 0x3F80);
  EXPECT_EQ(to_bfloat16(std::bit_cast<float>(0x3F818000u)).bits, 0x3F82);
  EXPECT_EQ(to_bfloat16(std::bit_cast<float>(0x7F7FFFFFu)).bits, 0x7F80);
  EXPECT_EQ(to_bfloat16(std::numeric_limits<float>::infinity()).bits, 0x7F80);
  EXPECT_EQ(to_bfloat16(std::bit_cast<float>(0x00000001u)).bits, 0x0000);  // tiny f32 subnormal
  EXPECT_EQ(to_bfloat16(std::bit_cast<float>(0x00008001u)).bits, 0x0001);
  // Signalling NaN becomes quiet, sign kept.
  EXPECT_EQ(to_bfloat16(std::bit_cast<float>(0xFF800001u)).bits & 0xFFC0, 0xFFC0);
  EXPECT_EQ(to_float16(std::bit_cast<float>(0x7F800001u)).bits & 0x7E00, 0x7E00);
}

TEST(HalfConversion, DoubleConvertsWithOneRounding) {
  // 1 + 2^-11 + 2^-40 is just above the f16 halfway point between 1 and 1 + 2^-10. Through f32
  // the 2^-40 is lost, the value becomes an exact tie and rounds down: double rounding.
  const double x = 1.0 + 0x1p-11 + 0x1p-40;
  EXPECT_EQ(to_float16(x).bits, 0x3C01);
  EXPECT_EQ(to_float16(static_cast<float>(x)).bits, 0x3C00);
  const double y = 1.0 + 0x1p-8 + 0x1p-40;  // the same for bf16
  EXPECT_EQ(to_bfloat16(y).bits, 0x3F81);
  EXPECT_EQ(to_bfloat16(static_cast<float>(y)).bits, 0x3F80);
}

// Opt-in (ctest -L stress): all 2^32 f32 patterns.
TEST(HalfConversionStress, AllFloatPatternsToBFloat16AgreeBetweenFastAndGenericPaths) {
  std::uint64_t mismatches = 0;
  for (std::uint64_t bits = 0; bits <= 0xFFFFFFFFull; ++bits) {
    const float x = std::bit_cast<float>(static_cast<std::uint32_t>(bits));
    if (to_bfloat16(x) != to_bfloat16(static_cast<double>(x))) ++mismatches;
  }
  EXPECT_EQ(mismatches, 0u);
}

#if defined(__x86_64__)
__attribute__((target("f16c"))) std::uint16_t hardware_float16(float x) {
  const __m128i half = _mm_cvtps_ph(_mm_set_ss(x), _MM_FROUND_TO_NEAREST_INT);
  return static_cast<std::uint16_t>(_mm_extract_epi16(half, 0));
}

bool cpu_has_f16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
}

TEST(HalfConversionStress, AllFloatPatternsToFloat16MatchF16cHardware) {
  if (!cpu_has_f16c()) GTEST_SKIP() << "CPU has no F16C";
  std::uint64_t mismatches = 0;
  for (std::uint64_t bits = 0; bits <= 0xFFFFFFFFull; ++bits) {
    const float x = std::bit_cast<float>(static_cast<std::uint32_t>(bits));
    if (to_float16(x).bits != hardware_float16(x)) ++mismatches;
  }
  EXPECT_EQ(mismatches, 0u);
}
#endif

}  // namespace
}  // namespace meshtensor
