#pragma once

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
std::uint64_t round_to_format(bool negative, std::uint64_t significand, int exponent, bool sticky,
                              int exponent_bits, int mantissa_bits);

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
