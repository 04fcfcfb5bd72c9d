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

}  // namespace meshtensor::testing
