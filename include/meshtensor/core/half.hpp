#pragma once

#include <bit>
#include <cstdint>

namespace meshtensor {

/// IEEE 754 binary16 value, stored as its bit pattern. Arithmetic goes through float.
struct Float16 {
  std::uint16_t bits = 0;
  friend bool operator==(Float16, Float16) = default;
};

/// bfloat16 value (the upper half of a binary32), stored as its bit pattern.
struct BFloat16 {
  std::uint16_t bits = 0;
  friend bool operator==(BFloat16, BFloat16) = default;
};

/// Rounds `value` to the binary format with `exponent_bits` and `mantissa_bits`, to nearest with
/// ties to even, with subnormals, overflow to infinity and signed zeros. NaN stays NaN (quiet bit
/// set, sign and the upper payload bits kept). Returns the bit pattern. One rounding, so a double
/// goes straight to the target without the double-rounding of a detour through float.
std::uint64_t round_double_to_format(double value, int exponent_bits, int mantissa_bits);

/// Rounds the magnitude `significand * 2^exponent` (plus a positive amount below one unit of
/// `significand` when `sticky`) to the binary format with `exponent_bits` and `mantissa_bits`,
/// to nearest with ties to even, with subnormals and overflow to infinity; `negative` sets the
/// sign. Returns the bit pattern. `sticky` needs a nonzero `significand`. This is the one
/// rounding step of every conversion and of exact sums (any wide value reduces to 64 significant
/// bits plus a sticky bit without changing how it rounds).
inline std::uint64_t round_to_format(bool negative, std::uint64_t significand, int exponent,
                                     bool sticky, int exponent_bits, int mantissa_bits) {
  const std::uint64_t sign = std::uint64_t{negative} << (exponent_bits + mantissa_bits);
  const std::uint64_t infinity = ((std::uint64_t{1} << exponent_bits) - 1) << mantissa_bits;
  if (significand == 0) return sign;

  // Normalise to a leading bit at position 63; the sticky part stays below bit 0.
  const int leading_zeros = std::countl_zero(significand);
  significand <<= leading_zeros;
  const int leading_exponent = exponent + 63 - leading_zeros;

  const int bias = (1 << (exponent_bits - 1)) - 1;
  const int min_normal_exponent = 1 - bias;
  int shift = 63 - mantissa_bits;  // keeps mantissa_bits + 1 bits
  if (leading_exponent < min_normal_exponent) shift += min_normal_exponent - leading_exponent;
  if (shift > 64) return sign;  // below half the smallest subnormal

  const std::uint64_t rounded_down = shift == 64 ? 0 : significand >> shift;
  const std::uint64_t remainder =
      shift == 64 ? significand : significand & ((std::uint64_t{1} << shift) - 1);
  const std::uint64_t half = std::uint64_t{1} << (shift - 1);
  // Bitwise, not short-circuit: the decision is data-dependent and a branch would mispredict.
  const std::uint64_t round_up = static_cast<std::uint64_t>(remainder > half) |
                                 (static_cast<std::uint64_t>(remainder == half) &
                                  (static_cast<std::uint64_t>(sticky) | (rounded_down & 1)));
  const std::uint64_t rounded = rounded_down + round_up;

  if (leading_exponent < min_normal_exponent) return sign | rounded;  // a carry lands on min normal
  if (leading_exponent > bias) return sign | infinity;
  const std::uint64_t biased =
      static_cast<std::uint64_t>(leading_exponent) + static_cast<std::uint64_t>(bias);
  // Adding the significand without its hidden bit lets a rounding carry bump the exponent.
  const std::uint64_t magnitude =
      (biased << mantissa_bits) + (rounded - (std::uint64_t{1} << mantissa_bits));
  return sign | (magnitude >= infinity ? infinity : magnitude);
}

/// Exact value of a bit pattern in the binary format with the given field widths.
double decode_format(std::uint64_t bits, int exponent_bits, int mantissa_bits);

/// f32 -> f16, round to nearest even.
Float16 to_float16(float value);
/// f64 -> f16 with a single rounding.
Float16 to_float16(double value);
/// f32 -> bf16, round to nearest even.
BFloat16 to_bfloat16(float value);
/// f64 -> bf16 with a single rounding.
BFloat16 to_bfloat16(double value);

/// f16 -> f32 (exact).
float to_float(Float16 value);
/// bf16 -> f32 (exact).
float to_float(BFloat16 value);

}  // namespace meshtensor
