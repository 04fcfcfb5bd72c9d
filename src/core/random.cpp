#include <cmath>

#include <meshtensor/core/error.hpp>
#include <meshtensor/core/random.hpp>

namespace meshtensor {

std::uint64_t mix64(std::uint64_t value) {
  value += 0x9E3779B97F4A7C15ull;
  value = (value ^ (value >> 30)) * 0xBF58476D1CE4E5B9ull;
  value = (value ^ (value >> 27)) * 0x94D049BB133111EBull;
  return value ^ (value >> 31);
}

double portable_log(double x) {
  int exponent = 0;
  double mantissa = std::frexp(x, &exponent);  // exact: x = mantissa * 2^exponent
  if (mantissa < 0.70710678118654752440) {
    mantissa *= 2;
    --exponent;
  }
  // log(m) = 2 atanh(t), t = (m-1)/(m+1), |t| < 0.172: the odd series converges fast.
  const double t = (mantissa - 1) / (mantissa + 1);
  const double t2 = t * t;
  double series = 1.0 / 25;
  for (int k = 11; k >= 0; --k)
    series = 1.0 / (2 * k + 1) + t2 * series;
  constexpr double kLn2High = 6.93147180369123816490e-01;  // ln 2 with trailing zero bits
  constexpr double kLn2Low = 1.90821492927058770002e-10;
  const double e = exponent;
  return e * kLn2High + (e * kLn2Low + 2 * t * series);
}

namespace {
// 53 random bits as a double in [-1, 1).
double signed_unit(std::uint64_t bits) {
  return static_cast<double>(bits >> 11) * 0x1.0p-52 - 1.0;
}
}  // namespace

double normal_sample(std::uint64_t seed, std::uint64_t index) {
  const std::uint64_t key = mix64(seed ^ 0x6D657368ull);
  // Marsaglia's polar method; each attempt draws a fresh pair from (seed, index, attempt).
  for (std::uint64_t attempt = 0; attempt < 64; ++attempt) {
    const std::uint64_t counter = (index << 7) | (attempt << 1);
    const double u = signed_unit(mix64(key ^ mix64(counter)));
    const double v = signed_unit(mix64(key ^ mix64(counter | 1)));
    const double s = u * u + v * v;
    if (s >= 1.0 || s == 0.0) continue;
    return u * std::sqrt(-2.0 * portable_log(s) / s);
  }
  return 0.0;  // 64 rejections in a row: probability below 1e-42
}

std::int64_t uniform_int_sample(std::uint64_t seed, std::uint64_t index, std::int64_t low,
                                std::int64_t high) {
  if (high < low) {
    throw InvalidArgument("uniform integer range [" + std::to_string(low) + ", " +
                          std::to_string(high) + "] is empty");
  }
  const std::uint64_t span = static_cast<std::uint64_t>(high) - static_cast<std::uint64_t>(low) + 1;
  const std::uint64_t bits = mix64(mix64(seed ^ 0x756E69ull) ^ mix64(index));
  const std::uint64_t offset = span == 0 ? bits : bits % span;  // span 0: the full 64-bit range
  return static_cast<std::int64_t>(static_cast<std::uint64_t>(low) + offset);
}

}  // namespace meshtensor
