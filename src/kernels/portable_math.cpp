#include <bit>
#include <cmath>
#include <cstdint>

#include <meshtensor/kernels/portable_math.hpp>

#include "simd_dispatch.hpp"

namespace meshtensor::kernels {

namespace {

/// 2^k for a normal result, by building the exponent field.
[[gnu::always_inline]] inline double power_of_two(std::int64_t k) {
  return std::bit_cast<double>(static_cast<std::uint64_t>(k + 1023) << 52);
}

/// round(x) for |x| < 2^51 by the 1.5 * 2^52 trick (exact under round-to-nearest).
double round_nearest(double x) {
  constexpr double kRound = 6755399441055744.0;
  return (x + kRound) - kRound;
}

// ln 2 in two parts: the high part has 32 significant bits, so k · high is exact for |k| < 2^21.
constexpr double kLn2High = 0.6931471803691238;
constexpr double kLn2Low = 1.9082149292705877e-10;

/// sin r and cos r for |r| <= pi/4 by their Taylor series (terms to r^25: below 2^-60 there).
double sin_series(double r) {
  const double r2 = r * r;
  double term = r;
  double sum = r;
  for (int n = 3; n <= 25; n += 2) {
    term = term * -r2 / static_cast<double>((n - 1) * n);
    sum = sum + term;
  }
  return sum;
}

double cos_series(double r) {
  const double r2 = r * r;
  double term = 1.0;
  double sum = 1.0;
  for (int n = 2; n <= 26; n += 2) {
    term = term * -r2 / static_cast<double>((n - 1) * n);
    sum = sum + term;
  }
  return sum;
}

/// x - k pi/2 (k = round(x · 2/pi)) in three parts of pi/2, the first two of 31 significant bits
/// so that k times them is exact for |k| < 2^22; the quadrant k mod 4 in `quadrant`.
double reduce_half_pi(double x, int& quadrant) {
  constexpr double kTwoOverPi = 0.636619772367581343076;
  constexpr double kHalfPi1 = 1.5707963267341256;     // 31 significant bits
  constexpr double kHalfPi2 = 6.07710050359346e-11;   // the next 31
  constexpr double kHalfPi3 = 2.912732056093356e-20;  // the rest
  const double k = round_nearest(x * kTwoOverPi);
  quadrant = static_cast<int>(static_cast<std::int64_t>(k) & 3);
  return ((x - k * kHalfPi1) - k * kHalfPi2) - k * kHalfPi3;
}

}  // namespace

double portable_exp(double x) {
  const double k = round_nearest(x * 1.44269504088896338700);
  const double r = (x - k * kLn2High) - k * kLn2Low;
  // e^r for |r| <= ln(2)/2 by its Taylor series to r^18 (below 2^-60).
  double term = 1.0;
  double sum = 1.0;
  for (int n = 1; n <= 18; ++n) {
    term = term * r / static_cast<double>(n);
    sum = sum + term;
  }
  const auto exponent = static_cast<std::int64_t>(k);
  // Two scalings keep each factor normal near the ends of the range.
  return sum * power_of_two(exponent / 2) * power_of_two(exponent - exponent / 2);
}

namespace {

/// exp_f64's Taylor coefficients 1/n!, n = 0 .. 13.
constexpr double kInverseFactorials[] = {1.0,
                                         1.0,
                                         0.5,
                                         0.16666666666666666,
                                         0.041666666666666664,
                                         0.008333333333333333,
                                         0.001388888888888889,
                                         0.0001984126984126984,
                                         2.48015873015873e-05,
                                         2.7557319223985893e-06,
                                         2.755731922398589e-07,
                                         2.505210838544172e-08,
                                         2.08767569878681e-09,
                                         1.6059043836821613e-10};

/// e^r for |r| <= ln(2)/2: the Taylor polynomial to r^13 in Horner form (the rest below 2^-60).
[[gnu::always_inline]] inline double exp_polynomial(double r) {
  double sum = kInverseFactorials[13];
  for (int n = 12; n >= 0; --n)
    sum = sum * r + kInverseFactorials[n];
  return sum;
}

/// e^x without branches (exp_f64, and the loops that vectorise it): every path computed, then
/// selected. The exponent comes from the bits of x·log2(e) + 1.5·2^52 (its integer part, as
/// round_nearest takes it), clamped where x is out of range, so no integer step can overflow.
[[gnu::always_inline]] inline double exp_selected(double x) {
  constexpr double kRound = 6755399441055744.0;
  const double t = x * 1.44269504088896338700 + kRound;
  const double k = t - kRound;
  const double r = (x - k * kLn2High) - k * kLn2Low;
  const double sum = exp_polynomial(r);
  const auto raw = static_cast<std::int64_t>(std::bit_cast<std::uint64_t>(t) -
                                             std::bit_cast<std::uint64_t>(kRound));
  const std::int64_t exponent = raw < -2000 ? -2000 : raw > 2000 ? 2000 : raw;
  const double value = sum * power_of_two(exponent / 2) * power_of_two(exponent - exponent / 2);
  const double limited = x > 709.782712893384 ? HUGE_VAL : x < -745.2 ? 0.0 : value;
  return x != x ? x : limited;
}

template <class T>
[[gnu::always_inline]] inline void exp_values_body(const double* x, double* out,
                                                   std::int64_t count) {
  for (std::int64_t i = 0; i < count; ++i)
    out[i] = exp_selected(x[i]);
}
MESHTENSOR_SIMD_KERNEL(exp_values, exp_values_body)

}  // namespace

double exp_f64(double x) {
  return exp_selected(x);
}

void exp_f64_values(const double* x, double* out, std::int64_t count) {
  exp_values<double>(x, out, count);
}

double portable_log(double x) {
  // x = m · 2^e with m in [sqrt(1/2), sqrt(2)).
  const auto bits = std::bit_cast<std::uint64_t>(x);
  std::int64_t e = static_cast<std::int64_t>((bits >> 52) & 0x7ff) - 1023;
  double m = std::bit_cast<double>((bits & 0x000fffffffffffffull) | 0x3ff0000000000000ull);
  if (m > 1.41421356237309504880) {
    m = m * 0.5;
    e = e + 1;
  }
  // log m = 2 atanh(s), s = (m - 1) / (m + 1), |s| <= 0.1716: the series to s^41.
  const double s = (m - 1.0) / (m + 1.0);
  const double s2 = s * s;
  double power = s;
  double sum = s;
  for (int n = 3; n <= 41; n += 2) {
    power = power * s2;
    sum = sum + power / static_cast<double>(n);
  }
  const auto k = static_cast<double>(e);
  return (k * kLn2High + 2.0 * sum) + k * kLn2Low;
}

double portable_sin(double x) {
  int quadrant = 0;
  const double r = reduce_half_pi(x, quadrant);
  switch (quadrant) {
    case 0:
      return sin_series(r);
    case 1:
      return cos_series(r);
    case 2:
      return -sin_series(r);
    default:
      return -cos_series(r);
  }
}

double portable_cos(double x) {
  int quadrant = 0;
  const double r = reduce_half_pi(x, quadrant);
  switch (quadrant) {
    case 0:
      return cos_series(r);
    case 1:
      return -sin_series(r);
    case 2:
      return -cos_series(r);
    default:
      return sin_series(r);
  }
}

}  // namespace meshtensor::kernels
