#include <bit>
#include <cmath>

#include <meshtensor/core/half.hpp>

namespace meshtensor {

std::uint64_t round_double_to_format(double value, int exponent_bits, int mantissa_bits) {
  constexpr int kSourceMantissa = 52;
  const auto bits = std::bit_cast<std::uint64_t>(value);
  const bool negative = (bits >> 63) != 0;
  const int source_exponent = static_cast<int>((bits >> kSourceMantissa) & 0x7FF);
  const std::uint64_t source_mantissa = bits & ((std::uint64_t{1} << kSourceMantissa) - 1);

  if (source_exponent == 0x7FF) {
    const std::uint64_t sign = std::uint64_t{negative} << (exponent_bits + mantissa_bits);
    const std::uint64_t infinity = ((std::uint64_t{1} << exponent_bits) - 1) << mantissa_bits;
    if (source_mantissa == 0) return sign | infinity;
    const std::uint64_t quiet = std::uint64_t{1} << (mantissa_bits - 1);
    return sign | infinity | quiet | (source_mantissa >> (kSourceMantissa - mantissa_bits));
  }
  if (source_exponent == 0) {
    return round_to_format(negative, source_mantissa, -1022 - kSourceMantissa, false, exponent_bits,
                           mantissa_bits);
  }
  return round_to_format(negative, (std::uint64_t{1} << kSourceMantissa) | source_mantissa,
                         source_exponent - 1023 - kSourceMantissa, false, exponent_bits,
                         mantissa_bits);
}

double decode_format(std::uint64_t bits, int exponent_bits, int mantissa_bits) {
  const bool negative = ((bits >> (exponent_bits + mantissa_bits)) & 1) != 0;
  const std::uint64_t max_exponent = (std::uint64_t{1} << exponent_bits) - 1;
  const std::uint64_t exponent = (bits >> mantissa_bits) & max_exponent;
  const std::uint64_t mantissa = bits & ((std::uint64_t{1} << mantissa_bits) - 1);
  const int bias = (1 << (exponent_bits - 1)) - 1;
  double magnitude = 0;
  if (exponent == max_exponent) {
    magnitude = mantissa == 0 ? INFINITY : NAN;
  } else if (exponent == 0) {
    magnitude = std::ldexp(static_cast<double>(mantissa), 1 - bias - mantissa_bits);
  } else {
    magnitude = std::ldexp(static_cast<double>((std::uint64_t{1} << mantissa_bits) | mantissa),
                           static_cast<int>(exponent) - bias - mantissa_bits);
  }
  return negative ? -magnitude : magnitude;
}

Float16 to_float16(double value) {
  return Float16{static_cast<std::uint16_t>(round_double_to_format(value, 5, 10))};
}
Float16 to_float16(float value) {
  return to_float16(static_cast<double>(value));
}

BFloat16 to_bfloat16(float value) {
  const auto bits = std::bit_cast<std::uint32_t>(value);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) {  // NaN: keep sign and upper payload, force quiet
    return BFloat16{static_cast<std::uint16_t>((bits >> 16) | 0x0040u)};
  }
  const std::uint32_t rounding = 0x7FFFu + ((bits >> 16) & 1u);
  return BFloat16{static_cast<std::uint16_t>((bits + rounding) >> 16)};
}
BFloat16 to_bfloat16(double value) {
  return BFloat16{static_cast<std::uint16_t>(round_double_to_format(value, 8, 7))};
}

float to_float(BFloat16 value) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(value.bits) << 16);
}

float to_float(Float16 value) {
  const std::uint32_t sign = static_cast<std::uint32_t>(value.bits & 0x8000u) << 16;
  int exponent = (value.bits >> 10) & 0x1F;
  std::uint32_t mantissa = value.bits & 0x3FFu;
  if (exponent == 0x1F) {  // Inf/NaN: widen the payload
    return std::bit_cast<float>(sign | 0x7F800000u | (mantissa << 13));
  }
  if (exponent == 0) {
    if (mantissa == 0) return std::bit_cast<float>(sign);
    // Subnormal: normalise, each shift lowers the exponent by one.
    exponent = 1;
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      --exponent;
    }
    mantissa &= 0x3FFu;
  }
  const auto biased = static_cast<std::uint32_t>(exponent + 112);  // 127 - 15
  return std::bit_cast<float>(sign | (biased << 23) | (mantissa << 13));
}

}  // namespace meshtensor
