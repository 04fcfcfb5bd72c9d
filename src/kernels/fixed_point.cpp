#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <span>
#include <vector>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

#include <fmt/format.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/kernels/elementwise.hpp>
#include <meshtensor/kernels/fixed_point.hpp>
#include <meshtensor/kernels/simd.hpp>

#include "simd_dispatch.hpp"

namespace meshtensor::kernels {

namespace {

__extension__ typedef unsigned __int128 Uint128;
__extension__ typedef __int128 Int128;

// Field widths and fixed-point shape of each floating storage type.
template <class T>
struct Format;
template <>
struct Format<double> {
  using Bits = std::uint64_t;
  static constexpr int kExponentBits = 11;
  static constexpr int kMantissaBits = 52;
  static constexpr int kLimbs = 2;
};
template <>
struct Format<float> {
  using Bits = std::uint32_t;
  static constexpr int kExponentBits = 8;
  static constexpr int kMantissaBits = 23;
  static constexpr int kLimbs = 1;
};
template <>
struct Format<BFloat16> {
  using Bits = std::uint16_t;
  static constexpr int kExponentBits = 8;
  static constexpr int kMantissaBits = 7;
  static constexpr int kLimbs = 1;
};
template <>
struct Format<Float16> {
  using Bits = std::uint16_t;
  static constexpr int kExponentBits = 5;
  static constexpr int kMantissaBits = 10;
  static constexpr int kLimbs = 1;
};

template <class T>
constexpr bool kIsFloating = std::is_same_v<T, double> || std::is_same_v<T, float> ||
                             std::is_same_v<T, BFloat16> || std::is_same_v<T, Float16>;

template <class T>
struct Traits : Format<T> {
  using F = Format<T>;
  using Bits = typename F::Bits;
  static constexpr int kExponentMask = (1 << F::kExponentBits) - 1;
  static constexpr int kBias = (1 << (F::kExponentBits - 1)) - 1;
  static constexpr int kWindow = F::kLimbs * kFixedPointLimbBits;
  // Exponents wider than a byte are keyed in bins of 8 binades: key k >= 1 holds the biased
  // exponents [8k + 8, 8k + 15] (the top bin, 254, the 7 finite ones left), key 0 the lowest 16
  // binades, where the window reaches below the smallest subnormal, so that nothing in them is
  // ever truncated. No bin is more than 8 binades wide where truncation can happen.
  static constexpr bool kBinned = F::kExponentBits > 8;
  static constexpr std::uint8_t kNonFiniteKey = kBinned ? 255 : kExponentMask;
  static constexpr int kBottomBinTop = 15;

  static Bits bits(T value) {
    if constexpr (std::is_same_v<T, Float16> || std::is_same_v<T, BFloat16>) {
      return value.bits;
    } else {
      return std::bit_cast<Bits>(value);
    }
  }
  static T from_bits(std::uint64_t pattern) {
    if constexpr (std::is_same_v<T, Float16> || std::is_same_v<T, BFloat16>) {
      return T{static_cast<std::uint16_t>(pattern)};
    } else {
      return std::bit_cast<T>(static_cast<Bits>(pattern));
    }
  }
  static int biased_exponent(Bits pattern) {
    return static_cast<int>((pattern >> F::kMantissaBits) & kExponentMask);
  }
  static std::uint8_t key(Bits pattern) {
    const int biased = biased_exponent(pattern);
    if constexpr (kBinned) {
      if (biased == kExponentMask) return kNonFiniteKey;
      return static_cast<std::uint8_t>(biased <= kBottomBinTop ? 0 : (biased - 8) >> 3);
    } else {
      return static_cast<std::uint8_t>(biased);
    }
  }
  // Every finite value whose key is at most `key` has a magnitude below 2^anchor(key).
  static constexpr int anchor(std::uint8_t key) {
    int top_biased = key;
    if constexpr (kBinned) {
      top_biased = key == 0 ? kBottomBinTop : std::min(key * 8 + 15, kExponentMask - 1);
    }
    return std::max(top_biased, 1) - kBias + 1;
  }
  // 2^(window - anchor): a value times it is its position in the window (exact in a double).
  static double to_window(std::uint8_t key) { return power_of_two(kWindow - anchor(key)); }
  // 2^(anchor - window): the value of the window's unit.
  static double window_unit(std::uint8_t key) { return power_of_two(anchor(key) - kWindow); }
  static double power_of_two(int exponent) {
    return std::bit_cast<double>(static_cast<std::uint64_t>(1023 + exponent) << 52);
  }
};

// The lowest f64 bin is never truncated: its window reaches below the smallest subnormal.
static_assert(Traits<double>::anchor(0) - Traits<double>::kWindow <= -1074);
// No f64 anchor lies more than 8 binades above the largest addend it covers (the floor).
static_assert(Traits<double>::anchor(254) == 1024 && Traits<double>::anchor(253) == 1017);

// Elements per block of reduce_exact: keys, limbs and results of a block stay in L1.
constexpr std::size_t kReduceBlock = 1024;

// Counts of +inf, -inf and NaN addends of a non-finite element, in 16-bit fields of limb 0.
constexpr int kNegativeInfinityShift = 16;
constexpr int kNanShift = 32;

void check_contiguous(const Tensor& tensor, const char* role, DType expected_dtype,
                      std::int64_t expected_numel) {
  if (!tensor.defined() || !tensor.is_contiguous()) {
    throw InvalidArgument(fmt::format("fixed point: {} must be a defined contiguous tensor", role));
  }
  if (tensor.dtype() != expected_dtype) {
    throw InvalidArgument(fmt::format("fixed point: {} must be {}, not {}", role,
                                      dtype_name(expected_dtype), dtype_name(tensor.dtype())));
  }
  if (tensor.numel() != expected_numel) {
    throw InvalidArgument(fmt::format("fixed point: {} holds {} elements, expected {}", role,
                                      tensor.numel(), expected_numel));
  }
}

// Calls fn(T{}) for a floating dtype; InvalidArgument otherwise.
template <class Fn>
void visit_floating(DType dtype, Fn&& fn) {
  visit_dtype(dtype, [&](auto zero) {
    using T = decltype(zero);
    if constexpr (kIsFloating<T>) {
      fn(zero);
    } else {
      throw InvalidArgument(
          fmt::format("exact reductions need a floating dtype (f64, f32, bf16, f16), not {}",
                      dtype_name(dtype)));
    }
  });
}

template <class T>
void keys_typed(const T* values, std::uint8_t* keys, std::size_t count) {
  using X = Traits<T>;
  for (std::size_t i = 0; i < count; ++i)
    keys[i] = X::key(X::bits(values[i]));
}

// Writes (or, with kAccumulate, adds) the limbs of every value.
template <class T, bool kAccumulate = false>
void encode_typed(const T* values, const std::uint8_t* keys, std::int64_t* fixed,
                  std::size_t count) {
  using X = Traits<T>;
  using Magnitude = std::conditional_t<(X::kWindow > 63), Uint128, std::uint64_t>;
  constexpr int kSignShift = X::kExponentBits + X::kMantissaBits;
  constexpr auto kMantissaMask = (typename X::Bits{1} << X::kMantissaBits) - 1;
  for (std::size_t i = 0; i < count; ++i) {
    const auto pattern = X::bits(values[i]);
    const std::uint8_t key = keys[i];
    std::int64_t* limbs = fixed + i * X::kLimbs;
    if constexpr (!kAccumulate) std::fill(limbs, limbs + X::kLimbs, 0);
    const bool negative = (pattern >> kSignShift) != 0;
    const int biased = X::biased_exponent(pattern);
    if (key == X::kNonFiniteKey) {
      if (biased == X::kExponentMask) {
        const bool nan = (pattern & kMantissaMask) != 0;
        limbs[0] += std::int64_t{1} << (nan ? kNanShift : negative ? kNegativeInfinityShift : 0);
      }
      continue;
    }
    if (X::key(pattern) > key) {
      throw InvalidArgument(fmt::format(
          "fixed point: element {} has scale key {} below its own value's key {}; keys must be "
          "the maximum over all addends",
          i, key, X::key(pattern)));
    }
    if constexpr (X::kWindow <= 52) {
      // value * 2^(window - anchor) is exact in a double (a power-of-two scaling of at most 24
      // significant bits, below 2^window), and the conversion to int64 truncates toward zero:
      // the same integer as the shifts below, in a few instructions.
      const double scale = X::to_window(key);
      limbs[0] += static_cast<std::int64_t>(element_to_double(values[i]) * scale);
      continue;
    }
    const std::uint64_t mantissa = pattern & kMantissaMask;
    const std::uint64_t significand =
        biased == 0 ? mantissa : mantissa | (std::uint64_t{1} << X::kMantissaBits);
    const int shift =
        std::max(biased, 1) - X::kBias - X::kMantissaBits + X::kWindow - X::anchor(key);
    // Left shifts stay below 2^window since |value| < 2^anchor; right shifts are the floor
    // (truncation toward zero). Branch-free: which one applies depends on the data.
    const int left = std::max(shift, 0);
    const int right = std::min(std::max(-shift, 0), 63);
    const Magnitude magnitude = (static_cast<Magnitude>(significand) << left) >> right;
    const std::int64_t sign_mask = -static_cast<std::int64_t>(negative);  // 0 or all ones
    for (int j = 0; j < X::kLimbs; ++j) {
      const auto limb = static_cast<std::int64_t>((magnitude >> (j * kFixedPointLimbBits)) &
                                                  ((std::uint64_t{1} << kFixedPointLimbBits) - 1));
      limbs[j] += (limb ^ sign_mask) - sign_mask;
    }
  }
}

template <class T>
T decode_non_finite(std::int64_t counts) {
  using X = Traits<T>;
  const std::int64_t field = (std::int64_t{1} << kNegativeInfinityShift) - 1;
  const bool nan = (counts >> kNanShift) != 0;
  const bool positive = (counts & field) != 0;
  const bool negative = ((counts >> kNegativeInfinityShift) & field) != 0;
  if (nan || (positive && negative)) return canonical_nan<T>();
  const std::uint64_t infinity = std::uint64_t{X::kExponentMask} << X::kMantissaBits;
  const std::uint64_t sign =
      negative ? std::uint64_t{1} << (X::kExponentBits + X::kMantissaBits) : 0;
  return X::from_bits(sign | infinity);
}

template <class T>
void decode_typed(const std::int64_t* fixed, const std::uint8_t* keys, std::int64_t divisor,
                  T* values, std::size_t count) {
  using X = Traits<T>;
  for (std::size_t i = 0; i < count; ++i) {
    const std::int64_t* limbs = fixed + i * X::kLimbs;
    if (keys[i] == X::kNonFiniteKey) {
      values[i] = decode_non_finite<T>(limbs[0]);
      continue;
    }
    if constexpr (X::kLimbs == 1) {
      if (divisor == 1) {  // the common case in 64-bit arithmetic
        const std::int64_t total = limbs[0];
        if constexpr (std::is_same_v<T, float>) {
          // Below 2^53 the scaled total is exact in a double (2^exponent is well inside its
          // range), so the hardware's one rounding to float is the correct one.
          constexpr std::int64_t kExactInDouble = std::int64_t{1} << 53;
          if (total > -kExactInDouble && total < kExactInDouble) {
            const double scale = X::window_unit(keys[i]);
            values[i] = static_cast<float>(static_cast<double>(total) * scale);
            continue;
          }
        }
        const std::uint64_t magnitude =
            total < 0 ? -static_cast<std::uint64_t>(total) : static_cast<std::uint64_t>(total);
        values[i] =
            X::from_bits(round_to_format(total < 0, magnitude, X::anchor(keys[i]) - X::kWindow,
                                         false, X::kExponentBits, X::kMantissaBits));
        continue;
      }
    }
    Int128 sum = 0;
    for (int j = 0; j < X::kLimbs; ++j)
      sum += static_cast<Int128>(limbs[j]) * (Int128{1} << (j * kFixedPointLimbBits));
    const bool negative = sum < 0;
    Uint128 magnitude = negative ? -static_cast<Uint128>(sum) : static_cast<Uint128>(sum);
    if (magnitude == 0) {
      values[i] = X::from_bits(0);
      continue;
    }
    int exponent = X::anchor(keys[i]) - X::kWindow;
    bool sticky = false;
    if (divisor != 1) {
      // Normalise to 128 bits so the quotient keeps at least 112 significant bits.
      const auto high = static_cast<std::uint64_t>(magnitude >> 64);
      const int zeros = high != 0 ? std::countl_zero(high)
                                  : 64 + std::countl_zero(static_cast<std::uint64_t>(magnitude));
      magnitude <<= zeros;
      exponent -= zeros;
      const auto d = static_cast<Uint128>(divisor);
      sticky = magnitude % d != 0;
      magnitude /= d;
    }
    const auto high = static_cast<std::uint64_t>(magnitude >> 64);
    if (high != 0) {
      const int drop = 64 - std::countl_zero(high);
      sticky = sticky || (magnitude & ((Uint128{1} << drop) - 1)) != 0;
      magnitude >>= drop;
      exponent += drop;
    }
    values[i] = X::from_bits(round_to_format(negative, static_cast<std::uint64_t>(magnitude),
                                             exponent, sticky, X::kExponentBits, X::kMantissaBits));
  }
}

// trunc(x) for |x| < 2^51 from exact operations only (SSE2 has no vector trunc): adding and
// subtracting 1.5 * 2^52 rounds |x| to the nearest integer, then one step down where that went
// past |x|; the sign is x's (a zero may come out as -0: callers add the results, and +0 last).
inline double trunc_small(double x) {
  constexpr double kRoundingMagic = 0x1.8p52;
  const double magnitude = std::fabs(x);
  double nearest = (magnitude + kRoundingMagic) - kRoundingMagic;
  nearest -= nearest > magnitude ? 1.0 : 0.0;
  return std::copysign(nearest, x);
}

// Most addends whose fixed-point sum stays exact in a double: k * 2^48 <= 2^53.
constexpr std::size_t kMaxDoubleAddends = std::size_t{1} << (53 - kFixedPointLimbBits);

// The sum of a block in one-limb fixed point, carried in doubles: each addend scaled to the
// window is a power-of-two scaling (exact), truncated to an integer below 2^48, and at most 32
// such integers add exactly in a double. So acc[i] is exactly the limb sum the int64 path adds,
// and it vectorises without 64-bit integer conversions. Finite addends only.
template <class T>
[[gnu::always_inline]] inline void fixed_point_sum_in_doubles_body(const T* const* in,
                                                                   std::size_t k,
                                                                   const std::uint8_t* keys,
                                                                   std::size_t n, double* acc) {
  using X = Traits<T>;
  static_assert(X::kLimbs == 1);
  double scale[kReduceBlock];
  for (std::size_t i = 0; i < n; ++i) {
    scale[i] = X::to_window(keys[i]);
  }
  for (std::size_t i = 0; i < n; ++i)
    acc[i] = trunc_small(element_to_double(in[0][i]) * scale[i]);
  for (std::size_t j = 1; j < k; ++j) {
    const T* add = in[j];
    for (std::size_t i = 0; i < n; ++i)
      acc[i] += trunc_small(element_to_double(add[i]) * scale[i]);
  }
}
MESHTENSOR_SIMD_KERNEL(fixed_point_sum_in_doubles, fixed_point_sum_in_doubles_body)

// How plain double sums of a block's one-limb addends relate to their fixed-point sums.
enum class DoubleSum : std::uint8_t {
  exact,       ///< no addend loses bits to the window: the double sum is the fixed-point sum
  truncated,   ///< some addend is too far below its element's largest: use the limbs
  non_finite,  ///< an infinity or NaN: use the limbs (they count them)
};

// sums[i] = the double sum of in[0..k)[i], k <= 32, and whether it is exact. An addend loses
// nothing to the window when its magnitude is at least 2^-(window - mantissa bits - 1) of the
// element's largest (or it is zero): then every addend is a multiple of the window's unit, and
// the sum of at most 32 of them needs at most 53 bits. The test on magnitudes is a little
// stricter than the one on exponents (a false "truncated" only costs the slower path), and where
// the threshold underflows the window's unit lies below every value of the format. Two passes
// over the inputs, floats compared in f32, no branches: it vectorises.
template <class T>
[[gnu::always_inline]] inline DoubleSum sum_in_doubles_body(const T* const* in, std::size_t k,
                                                            std::size_t n,
                                                            float* __restrict largest,
                                                            double* __restrict sums) {
  using X = Traits<T>;
  constexpr float kFiniteMax = std::numeric_limits<float>::max();
  const float below = std::ldexp(1.0f, -(X::kWindow - X::kMantissaBits - 1));
  // Each loop works in one element width, which is what vectorises.
  float widened[kReduceBlock];
  const auto widen = [&](const T* __restrict x) {
    for (std::size_t i = 0; i < n; ++i) {
      if constexpr (std::is_same_v<T, float>) {
        widened[i] = x[i];
      } else {
        widened[i] = to_float(x[i]);
      }
    }
  };
  const auto values = [&](const T* x) -> const float* {
    if constexpr (std::is_same_v<T, float>) {
      return x;
    } else {
      widen(x);
      return widened;
    }
  };
  for (std::size_t i = 0; i < n; ++i)
    largest[i] = 0;
  int non_finite = 0;
  for (std::size_t j = 0; j < k; ++j) {
    const float* __restrict x = values(in[j]);
    for (std::size_t i = 0; i < n; ++i) {
      const float magnitude = std::fabs(x[i]);
      non_finite |= magnitude <= kFiniteMax ? 0 : 1;  // NaN compares false
      largest[i] = magnitude > largest[i] ? magnitude : largest[i];
    }
  }
  if (non_finite != 0) return DoubleSum::non_finite;
  for (std::size_t i = 0; i < n; ++i)
    largest[i] *= below;
  int truncated = 0;
  for (std::size_t j = 0; j < k; ++j) {
    const float* __restrict x = values(in[j]);
    for (std::size_t i = 0; i < n; ++i) {
      const float magnitude = std::fabs(x[i]);
      truncated |= static_cast<int>(magnitude > 0) & static_cast<int>(magnitude < largest[i]);
    }
    if (j == 0) {
      for (std::size_t i = 0; i < n; ++i)
        sums[i] = x[i];
    } else {
      for (std::size_t i = 0; i < n; ++i)
        sums[i] += x[i];
    }
  }
  return truncated != 0 ? DoubleSum::truncated : DoubleSum::exact;
}
MESHTENSOR_SIMD_KERNEL(sum_in_doubles, sum_in_doubles_body)

// The common case of reduce_exact for f32 (sum, at most kMaxDoubleAddends addends) with everything
// in registers, one pass: 16 (or 8) elements at a time, over every input, the double sum, the
// largest and the smallest non-zero magnitude. While every element is finite and no addend is
// truncated by the window (the test of sum_in_doubles), the double sum is the fixed-point sum
// and its f32 rounding (+ 0.0, which turns an exact zero into +0) the result, stored into every
// output; at the first group of elements where that fails, it stops and returns how many
// elements it did, and the generic path goes on from there. Each group is read whole before it
// is stored, so outputs may be inputs.
struct F32Sum {
  std::span<const std::byte* const> in;  ///< f32 inputs
  std::span<std::byte* const> out;       ///< f32 outputs
  std::size_t offset;                    ///< first element
  std::size_t count;                     ///< elements from there
  float below;                           ///< the truncation threshold, relative to the largest
  const float* input(std::size_t j) const { return reinterpret_cast<const float*>(in[j]) + offset; }
  float* output(std::size_t o) const { return reinterpret_cast<float*>(out[o]) + offset; }
};

#if defined(__x86_64__) && defined(__GNUC__)
// GCC 12 takes the undefined upper halves inside the cast and convert intrinsics for
// uninitialised reads.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
// Two addends: their exact sum rounded once is the IEEE f32 sum (a correctly rounded operation).
// A non-finite addend makes that sum non-finite, which sends the group to the generic path (as
// does a finite sum that overflows, which the generic path rounds to the same infinity).
[[gnu::target("avx512f,avx512dq")]] std::size_t exact_f32_pair_avx512(const F32Sum& job) {
  const __m512 finite_max = _mm512_set1_ps(std::numeric_limits<float>::max());
  const __m512 zero = _mm512_setzero_ps();
  const __m512 below = _mm512_set1_ps(job.below);
  const float* const a = job.input(0);
  const float* const b = job.input(1);
  for (std::size_t i = 0; i < job.count; i += 16) {
    const __mmask16 lanes = job.count - i >= 16
                                ? __mmask16{0xFFFF}
                                : static_cast<__mmask16>((1U << (job.count - i)) - 1);
    const __m512 x = _mm512_maskz_loadu_ps(lanes, a + i);
    const __m512 y = _mm512_maskz_loadu_ps(lanes, b + i);
    const __m512 sum = _mm512_add_ps(x, y);
    const __m512 mx = _mm512_abs_ps(x);
    const __m512 my = _mm512_abs_ps(y);
    const __m512 least = _mm512_min_ps(mx, my);
    const __m512 floor = _mm512_mul_ps(_mm512_max_ps(mx, my), below);
    const __mmask16 bad =
        _mm512_kor(_mm512_cmp_ps_mask(_mm512_abs_ps(sum), finite_max, _CMP_NLE_UQ),
                   _mm512_kand(_mm512_cmp_ps_mask(least, zero, _CMP_GT_OQ),
                               _mm512_cmp_ps_mask(least, floor, _CMP_LT_OQ)));
    if (bad != 0) return i;
    const __m512 result = _mm512_add_ps(sum, zero);
    for (std::size_t o = 0; o < job.out.size(); ++o)
      _mm512_mask_storeu_ps(job.output(o) + i, lanes, result);
  }
  return job.count;
}

[[gnu::target("avx512f,avx512dq")]] std::size_t exact_f32_prefix_avx512(const F32Sum& job) {
  if (job.in.size() == 2) return exact_f32_pair_avx512(job);
  const __m512 finite_max = _mm512_set1_ps(std::numeric_limits<float>::max());
  const __m512 none = _mm512_set1_ps(std::numeric_limits<float>::infinity());
  const __m512 zero = _mm512_setzero_ps();
  const __m512 below = _mm512_set1_ps(job.below);
  for (std::size_t i = 0; i < job.count; i += 16) {
    const __mmask16 lanes = job.count - i >= 16
                                ? __mmask16{0xFFFF}
                                : static_cast<__mmask16>((1U << (job.count - i)) - 1);
    __m512 x = _mm512_maskz_loadu_ps(lanes, job.input(0) + i);
    __m512 magnitude = _mm512_abs_ps(x);
    __mmask16 bad = _mm512_cmp_ps_mask(magnitude, finite_max, _CMP_NLE_UQ);
    __m512 big = magnitude;
    __m512 small =
        _mm512_mask_blend_ps(_mm512_cmp_ps_mask(magnitude, zero, _CMP_GT_OQ), none, magnitude);
    __m512d low = _mm512_cvtps_pd(_mm512_castps512_ps256(x));
    __m512d high = _mm512_cvtps_pd(_mm512_extractf32x8_ps(x, 1));
    for (std::size_t j = 1; j < job.in.size(); ++j) {
      x = _mm512_maskz_loadu_ps(lanes, job.input(j) + i);
      magnitude = _mm512_abs_ps(x);
      bad = _mm512_kor(bad, _mm512_cmp_ps_mask(magnitude, finite_max, _CMP_NLE_UQ));
      big = _mm512_max_ps(big, magnitude);
      small = _mm512_mask_blend_ps(_mm512_kand(_mm512_cmp_ps_mask(magnitude, zero, _CMP_GT_OQ),
                                               _mm512_cmp_ps_mask(magnitude, small, _CMP_LT_OQ)),
                                   small, magnitude);
      low = _mm512_add_pd(low, _mm512_cvtps_pd(_mm512_castps512_ps256(x)));
      high = _mm512_add_pd(high, _mm512_cvtps_pd(_mm512_extractf32x8_ps(x, 1)));
    }
    const __m256 low_f = _mm512_cvtpd_ps(_mm512_add_pd(low, _mm512_setzero_pd()));
    const __m256 high_f = _mm512_cvtpd_ps(_mm512_add_pd(high, _mm512_setzero_pd()));
    const __m512 result = _mm512_insertf32x8(_mm512_castps256_ps512(low_f), high_f, 1);
    bad = _mm512_kor(bad, _mm512_cmp_ps_mask(small, _mm512_mul_ps(big, below), _CMP_LT_OQ));
    if (bad != 0) return i;
    for (std::size_t o = 0; o < job.out.size(); ++o)
      _mm512_mask_storeu_ps(job.output(o) + i, lanes, result);
  }
  return job.count;
}

[[gnu::target("avx2")]] std::size_t exact_f32_prefix_avx2(const F32Sum& job) {
  const __m256 finite_max = _mm256_set1_ps(std::numeric_limits<float>::max());
  const __m256 none = _mm256_set1_ps(std::numeric_limits<float>::infinity());
  const __m256 zero = _mm256_setzero_ps();
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256 below = _mm256_set1_ps(job.below);
  const std::size_t whole = job.count / 8 * 8;  // the generic path takes the ragged end
  for (std::size_t i = 0; i < whole; i += 8) {
    __m256 x = _mm256_loadu_ps(job.input(0) + i);
    __m256 magnitude = _mm256_andnot_ps(sign, x);
    __m256 bad = _mm256_cmp_ps(magnitude, finite_max, _CMP_NLE_UQ);
    __m256 big = magnitude;
    __m256 small = _mm256_blendv_ps(none, magnitude, _mm256_cmp_ps(magnitude, zero, _CMP_GT_OQ));
    __m256d low = _mm256_cvtps_pd(_mm256_castps256_ps128(x));
    __m256d high = _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1));
    for (std::size_t j = 1; j < job.in.size(); ++j) {
      x = _mm256_loadu_ps(job.input(j) + i);
      magnitude = _mm256_andnot_ps(sign, x);
      bad = _mm256_or_ps(bad, _mm256_cmp_ps(magnitude, finite_max, _CMP_NLE_UQ));
      big = _mm256_max_ps(big, magnitude);
      const __m256 smaller = _mm256_and_ps(_mm256_cmp_ps(magnitude, zero, _CMP_GT_OQ),
                                           _mm256_cmp_ps(magnitude, small, _CMP_LT_OQ));
      small = _mm256_blendv_ps(small, magnitude, smaller);
      low = _mm256_add_pd(low, _mm256_cvtps_pd(_mm256_castps256_ps128(x)));
      high = _mm256_add_pd(high, _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1)));
    }
    bad = _mm256_or_ps(bad, _mm256_cmp_ps(small, _mm256_mul_ps(big, below), _CMP_LT_OQ));
    if (_mm256_movemask_ps(bad) != 0) return i;
    const __m128 low_f = _mm256_cvtpd_ps(_mm256_add_pd(low, _mm256_setzero_pd()));
    const __m128 high_f = _mm256_cvtpd_ps(_mm256_add_pd(high, _mm256_setzero_pd()));
    const __m256 result = _mm256_set_m128(high_f, low_f);
    for (std::size_t o = 0; o < job.out.size(); ++o)
      _mm256_storeu_ps(job.output(o) + i, result);
  }
  return whole;
}
#pragma GCC diagnostic pop
#endif

// exact_f32_prefix_* for the SIMD level in use; 0 (the generic path does it all) without one.
std::size_t exact_f32_prefix(const F32Sum& job) {
#if defined(__x86_64__) && defined(__GNUC__)
  switch (simd_level()) {
    case SimdLevel::avx512:
      return exact_f32_prefix_avx512(job);
    case SimdLevel::avx2:
      return exact_f32_prefix_avx2(job);
    default:
      break;
  }
#endif
  (void)job;
  return 0;
}

// Exact reduction of k inputs, block by block so keys, limbs and results stay in cache. Three
// ways to the same integers, so to the same bits, chosen per block:
// - one-limb formats, at most 32 finite addends, none so far below its element's largest that
//   the window truncates it: the plain double sum (about the cost of an ordered sum);
// - one-limb formats, at most 32 finite addends: the limbs carried in doubles;
// - otherwise (f64, non-finite addends, more addends): int64 limbs.
template <class T>
void reduce_exact_typed(ReduceOp op, std::span<const std::byte* const> inputs,
                        std::span<std::byte* const> outputs, std::size_t count) {
  using X = Traits<T>;
  std::array<std::uint8_t, kReduceBlock> keys;
  std::array<std::uint8_t, kReduceBlock> own_keys;
  std::array<float, kReduceBlock> largest;
  std::array<std::int64_t, kReduceBlock * X::kLimbs> limbs;
  std::array<double, kReduceBlock> sums;
  std::array<T, kReduceBlock> result;
  thread_local std::vector<const T*> block;
  block.resize(inputs.size());
  const std::size_t k = inputs.size();
  const auto divisor = static_cast<std::int64_t>(op == ReduceOp::avg ? k : 1);
  const auto compute_keys = [&](std::size_t n) {
    keys_typed(block[0], keys.data(), n);
    for (std::size_t j = 1; j < k; ++j) {
      keys_typed(block[j], own_keys.data(), n);
      for (std::size_t i = 0; i < n; ++i)
        keys[i] = std::max(keys[i], own_keys[i]);
    }
  };
  // f32 sums: registers-only while the double sum is the fixed-point sum, blocks of the generic
  // path where it is not.
  const bool f32_fast = std::is_same_v<T, float> && divisor == 1 && k <= kMaxDoubleAddends;
  for (std::size_t begin = 0; begin < count; begin += kReduceBlock) {
    if (f32_fast) {
      begin += exact_f32_prefix({inputs, outputs, begin, count - begin,
                                 std::ldexp(1.0f, -(X::kWindow - X::kMantissaBits - 1))});
      if (begin == count) break;
    }
    const std::size_t n = std::min(kReduceBlock, count - begin);
    for (std::size_t j = 0; j < k; ++j)
      block[j] = reinterpret_cast<const T*>(inputs[j]) + begin;
    DoubleSum how = DoubleSum::non_finite;
    if constexpr (X::kLimbs == 1) {
      if (k <= kMaxDoubleAddends) {
        how = sum_in_doubles<T>(block.data(), k, n, largest.data(), sums.data());
        if (how == DoubleSum::truncated || divisor != 1) compute_keys(n);
        if (how == DoubleSum::truncated) {
          fixed_point_sum_in_doubles<T>(block.data(), k, keys.data(), n, sums.data());
          for (std::size_t i = 0; i < n; ++i) {
            sums[i] *= X::window_unit(keys[i]);  // exact: a power-of-two scaling
          }
        }
      }
    }
    if (how != DoubleSum::non_finite && divisor == 1) {
      // One rounding to T; + 0.0 turns an exact zero into +0.
      for (std::size_t i = 0; i < n; ++i) {
        if constexpr (std::is_same_v<T, float>) {
          result[i] = static_cast<float>(sums[i] + 0.0);  // inline, so that it vectorises
        } else {
          result[i] = element_from_double<T>(sums[i] + 0.0);
        }
      }
    } else if (how != DoubleSum::non_finite) {
      // The exact sum as the integer the limbs would hold, then the divide of decode.
      for (std::size_t i = 0; i < n; ++i) {
        limbs[i] = static_cast<std::int64_t>(sums[i] * X::to_window(keys[i]));
      }
      decode_typed(limbs.data(), keys.data(), divisor, result.data(), n);
    } else {
      compute_keys(n);
      std::fill(limbs.begin(), limbs.begin() + static_cast<std::ptrdiff_t>(n * X::kLimbs), 0);
      for (std::size_t j = 0; j < k; ++j)
        encode_typed<T, true>(block[j], keys.data(), limbs.data(), n);
      decode_typed(limbs.data(), keys.data(), divisor, result.data(), n);
    }
    for (std::byte* out : outputs)
      std::memcpy(out + begin * sizeof(T), result.data(), n * sizeof(T));
  }
}

}  // namespace

void reduce_exact(DType dtype, ReduceOp op, std::span<const std::byte* const> inputs,
                  std::span<std::byte* const> outputs, std::size_t count) {
  if (inputs.empty()) throw InvalidArgument("reduce_exact needs at least one input");
  if (op != ReduceOp::sum && op != ReduceOp::avg) {
    throw InvalidArgument(
        fmt::format("reduce_exact sums or averages; {} is exact in any order", reduce_op_name(op)));
  }
  if (static_cast<std::int64_t>(inputs.size()) > kMaxExactAddends) {
    throw InvalidArgument(fmt::format("reduce_exact: {} inputs exceed the limit of {} addends",
                                      inputs.size(), kMaxExactAddends));
  }
  visit_floating(
      dtype, [&](auto zero) { reduce_exact_typed<decltype(zero)>(op, inputs, outputs, count); });
}

FixedPointFormat fixed_point_format(DType dtype) {
  FixedPointFormat format;
  visit_floating(dtype, [&](auto zero) {
    using X = Traits<decltype(zero)>;
    format.limbs = X::kLimbs;
    format.window_bits = X::kWindow;
  });
  return format;
}

void fixed_point_keys(const Tensor& values, Tensor keys) {
  check_contiguous(values, "values", values.dtype(), values.numel());
  check_contiguous(keys, "keys", DType::u8, values.numel());
  visit_floating(values.dtype(), [&](auto zero) {
    using T = decltype(zero);
    keys_typed(reinterpret_cast<const T*>(values.bytes().data()),
               reinterpret_cast<std::uint8_t*>(keys.bytes().data()),
               static_cast<std::size_t>(values.numel()));
  });
}

void encode_fixed_point(const Tensor& values, const Tensor& keys, Tensor fixed) {
  const FixedPointFormat format = fixed_point_format(values.dtype());
  check_contiguous(values, "values", values.dtype(), values.numel());
  check_contiguous(keys, "keys", DType::u8, values.numel());
  check_contiguous(fixed, "fixed", DType::i64, values.numel() * format.limbs);
  visit_floating(values.dtype(), [&](auto zero) {
    using T = decltype(zero);
    encode_typed(reinterpret_cast<const T*>(values.bytes().data()),
                 reinterpret_cast<const std::uint8_t*>(keys.bytes().data()),
                 reinterpret_cast<std::int64_t*>(fixed.bytes().data()),
                 static_cast<std::size_t>(values.numel()));
  });
}

void decode_fixed_point(const Tensor& fixed, const Tensor& keys, std::int64_t divisor,
                        Tensor values) {
  const FixedPointFormat format = fixed_point_format(values.dtype());
  if (divisor < 1) {
    throw InvalidArgument(fmt::format("fixed point: divisor must be at least 1, not {}", divisor));
  }
  check_contiguous(values, "values", values.dtype(), values.numel());
  check_contiguous(keys, "keys", DType::u8, values.numel());
  check_contiguous(fixed, "fixed", DType::i64, values.numel() * format.limbs);
  visit_floating(values.dtype(), [&](auto zero) {
    using T = decltype(zero);
    decode_typed(reinterpret_cast<const std::int64_t*>(fixed.bytes().data()),
                 reinterpret_cast<const std::uint8_t*>(keys.bytes().data()), divisor,
                 reinterpret_cast<T*>(values.bytes().data()),
                 static_cast<std::size_t>(values.numel()));
  });
}

}  // namespace meshtensor::kernels
