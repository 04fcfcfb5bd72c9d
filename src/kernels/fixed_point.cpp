#include <algorithm>
#include <array>
#include <bit>
#include <cstring>

#include <fmt/format.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/kernels/elementwise.hpp>
#include <meshtensor/kernels/fixed_point.hpp>

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
};

// The lowest f64 bin is never truncated: its window reaches below the smallest subnormal.
static_assert(Traits<double>::anchor(0) - Traits<double>::kWindow <= -1074);
// No f64 anchor lies more than 8 binades above the largest addend it covers (the floor).
static_assert(Traits<double>::anchor(254) == 1024 && Traits<double>::anchor(253) == 1017);

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
      const auto scale = std::bit_cast<double>(
          static_cast<std::uint64_t>(1023 + X::kWindow - X::anchor(key)) << 52);
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
            const int exponent = X::anchor(keys[i]) - X::kWindow;
            const auto scale =
                std::bit_cast<double>(static_cast<std::uint64_t>(1023 + exponent) << 52);
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

// Exact reduction of k inputs, block by block so keys, limbs and results stay in cache.
template <class T>
void reduce_exact_typed(ReduceOp op, std::span<const std::byte* const> inputs,
                        std::span<std::byte* const> outputs, std::size_t count) {
  using X = Traits<T>;
  constexpr std::size_t kBlock = 1024;
  std::array<std::uint8_t, kBlock> keys;
  std::array<std::uint8_t, kBlock> own_keys;
  std::array<std::int64_t, kBlock * X::kLimbs> limbs;
  std::array<T, kBlock> result;
  const auto divisor = static_cast<std::int64_t>(op == ReduceOp::avg ? inputs.size() : 1);
  for (std::size_t begin = 0; begin < count; begin += kBlock) {
    const std::size_t n = std::min(kBlock, count - begin);
    keys_typed(reinterpret_cast<const T*>(inputs[0]) + begin, keys.data(), n);
    for (std::size_t j = 1; j < inputs.size(); ++j) {
      keys_typed(reinterpret_cast<const T*>(inputs[j]) + begin, own_keys.data(), n);
      for (std::size_t i = 0; i < n; ++i)
        keys[i] = std::max(keys[i], own_keys[i]);
    }
    std::fill(limbs.begin(), limbs.begin() + static_cast<std::ptrdiff_t>(n * X::kLimbs), 0);
    for (const std::byte* input : inputs)
      encode_typed<T, true>(reinterpret_cast<const T*>(input) + begin, keys.data(), limbs.data(),
                            n);
    decode_typed(limbs.data(), keys.data(), divisor, result.data(), n);
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
