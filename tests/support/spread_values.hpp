#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include <meshtensor/core/random.hpp>
#include <meshtensor/core/tensor.hpp>

namespace meshtensor::testing {

/// Addend `r` of a test sum: element i lies in the binades [base_i, base_i + spread), where
/// base_i in [low_base, high_base] depends on (seed, i) only, with a random sign and a full
/// mantissa drawn from (seed, r, i), rounded to `dtype`. Any rank can rebuild every addend.
inline Tensor spread_values(DType dtype, std::int64_t count, int low_base, int high_base,
                            int spread, std::uint64_t seed, int r) {
  std::vector<double> values;
  for (std::int64_t i = 0; i < count; ++i) {
    const auto index = static_cast<std::uint64_t>(i);
    const int base =
        low_base + static_cast<int>(mix64(seed ^ index) %
                                    static_cast<std::uint64_t>(high_base - low_base + 1));
    const std::uint64_t bits =
        mix64(seed + 1000003ull * static_cast<std::uint64_t>(r) + index * 7919ull);
    const double mantissa = 1.0 + static_cast<double>(bits >> 12) * 0x1p-52;
    const int exponent = base + static_cast<int>((bits >> 3) % static_cast<std::uint64_t>(spread));
    values.push_back(((bits & 1) != 0 ? -1.0 : 1.0) * std::ldexp(mantissa, exponent));
  }
  return Tensor::from_values({count}, dtype, values);
}

/// f32 [rows, cols] over `binades` binades below 1 and a quarter of that above (a tenth of the
/// values zero), normal mantissas and signs drawn from `seed`: sums whose exact windows move as
/// addends arrive.
inline Tensor spread_matrix(std::int64_t rows, std::int64_t cols, std::uint64_t seed,
                            int binades = 40) {
  Tensor t(Shape{rows, cols}, DType::f32);
  auto v = t.values<float>();
  for (std::size_t i = 0; i < v.size(); ++i) {
    const std::int64_t e = uniform_int_sample(seed, 2 * i, -binades, binades / 4);
    const double keep = uniform_int_sample(seed, 2 * i + 1, 0, 9) == 0 ? 0.0 : 1.0;
    v[i] = static_cast<float>(keep * normal_sample(seed + 1, i) *
                              std::ldexp(1.0, static_cast<int>(e)));
  }
  return t;
}

}  // namespace meshtensor::testing
