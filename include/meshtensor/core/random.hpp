#pragma once

#include <cstdint>

namespace meshtensor {

/// SplitMix64 finaliser: a bijective 64-bit mixer.
std::uint64_t mix64(std::uint64_t value);

/// Standard-normal sample number `index` of stream `seed`. Uses only IEEE-exact operations
/// (+, -, *, /, sqrt) and a fixed-series logarithm, so the bits are the same on every platform
/// and depend on (seed, index) alone.
double normal_sample(std::uint64_t seed, std::uint64_t index);

/// Uniform integer in [low, high] for sample `index` of stream `seed`.
std::int64_t uniform_int_sample(std::uint64_t seed, std::uint64_t index, std::int64_t low,
                                std::int64_t high);

/// Natural logarithm of x > 0 from a fixed series (platform-independent bits, about 1 ulp).
double portable_log(double x);

}  // namespace meshtensor
