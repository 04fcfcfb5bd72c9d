#pragma once

#include <array>
#include <bit>
#include <cmath>
#include <cstdint>

#include <meshtensor/core/half.hpp>

namespace meshtensor::testing {

__extension__ typedef unsigned __int128 ReferenceUint128;

/// The exact sum of doubles in a wide two's-complement integer (value * 2^kOffset), rounded once
/// to any binary format: the reference exact reductions are checked against. Shares nothing with
/// the fixed-point kernels except the final round_to_format, which has tests of its own.
class ExactSumReference {
 public:
  /// Adds a finite double exactly.
  void add(double value) {
    if (value == 0) return;
    int exponent = 0;
    const double fraction = std::frexp(std::fabs(value), &exponent);
    const auto significand = static_cast<std::uint64_t>(std::ldexp(fraction, 53));
    add_shifted(significand, exponent - 53 + kOffset, std::signbit(value));
  }

  /// The sum divided by `divisor`, correctly rounded to the format (bit pattern; exact zero is
  /// +0).
  std::uint64_t rounded(int exponent_bits, int mantissa_bits, std::uint64_t divisor = 1) const {
    Words magnitude = words_;
    const bool negative = (magnitude[kWords - 1] >> 63) != 0;
    if (negative) negate(magnitude);
    bool sticky = false;
    if (divisor != 1) {
      ReferenceUint128 remainder = 0;
      for (int w = kWords - 1; w >= 0; --w) {
        const ReferenceUint128 current = (remainder << 64) | magnitude[w];
        magnitude[w] = static_cast<std::uint64_t>(current / divisor);
        remainder = current % divisor;
      }
      sticky = remainder != 0;
    }
    int top = kWords - 1;
    while (top >= 0 && magnitude[top] == 0)
      --top;
    if (top < 0) return 0;
    const int leading = top * 64 + 63 - std::countl_zero(magnitude[top]);
    const int low = leading - 63;  // bit index of the significand's last bit
    std::uint64_t significand = 0;
    for (int b = 0; b < 64; ++b) {
      const int index = low + b;
      if (index >= 0 && ((magnitude[index / 64] >> (index % 64)) & 1) != 0)
        significand |= std::uint64_t{1} << b;
    }
    for (int index = 0; index < low; ++index)
      sticky = sticky || ((magnitude[index / 64] >> (index % 64)) & 1) != 0;
    return round_to_format(negative, significand, low - kOffset, sticky, exponent_bits,
                           mantissa_bits);
  }

 private:
  static constexpr int kOffset = 1200;
  static constexpr int kWords = 40;  // 2560 bits: 2^-1200 .. 2^1360
  using Words = std::array<std::uint64_t, kWords>;

  void add_shifted(std::uint64_t significand, int position, bool negative) {
    Words addend{};
    const int word = position / 64;
    const int bit = position % 64;
    addend[word] = significand << bit;
    if (bit != 0) addend[word + 1] = significand >> (64 - bit);
    if (negative) negate(addend);
    unsigned carry = 0;
    for (int w = 0; w < kWords; ++w) {
      const ReferenceUint128 total = static_cast<ReferenceUint128>(words_[w]) + addend[w] + carry;
      words_[w] = static_cast<std::uint64_t>(total);
      carry = static_cast<unsigned>(total >> 64);
    }
  }

  static void negate(Words& words) {
    unsigned carry = 1;
    for (std::uint64_t& w : words) {
      const ReferenceUint128 total = static_cast<ReferenceUint128>(~w) + carry;
      w = static_cast<std::uint64_t>(total);
      carry = static_cast<unsigned>(total >> 64);
    }
  }

  Words words_{};
};

}  // namespace meshtensor::testing
