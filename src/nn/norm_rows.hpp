#pragma once

#include <algorithm>
#include <array>
#include <cstdint>

namespace meshtensor::nn {

/// Rows whose reduction chains the norms run side by side: each row's sums stay one chain over
/// ascending j, and the chains of kNormRows rows overlap (a lone chain waits out each add's
/// latency). A last group short of rows repeats its last row and drops those results.
inline constexpr std::int64_t kNormRows = 8;

/// The kNormRows rows of a group, of a [rows, n] row-major tensor.
struct NormRowGroup {
  std::array<std::int64_t, kNormRows> at;  ///< each row's offset r·n (past the last: the last's)
  std::int64_t count;                      ///< rows of the group that are real
};

/// The group of rows that starts at row r0.
inline NormRowGroup norm_row_group(std::int64_t r0, std::int64_t rows, std::int64_t n) {
  NormRowGroup group{{}, std::min(kNormRows, rows - r0)};
  for (std::int64_t r = 0; r < kNormRows; ++r)
    group.at[static_cast<std::size_t>(r)] = std::min(r0 + r, rows - 1) * n;
  return group;
}

}  // namespace meshtensor::nn
