#pragma once

#include <cstdint>

namespace meshtensor::nn {

/// Rows whose reduction chains the norms run side by side: each row's sums stay one chain over
/// ascending j, and the chains of kNormRows rows overlap (a lone chain waits out each add's
/// latency). A last group short of rows repeats its last row and drops those results.
inline constexpr std::int64_t kNormRows = 8;

}  // namespace meshtensor::nn
