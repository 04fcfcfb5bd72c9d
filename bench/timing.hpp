#pragma once

#include <algorithm>
#include <chrono>
#include <vector>

namespace meshtensor::bench {

/// Median of `values`: the mean of the two middle ones for an even count; 0 for none. The one
/// median every benchmark reports.
inline double median(std::vector<double> values) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

/// Seconds one call of `fn` takes.
template <class Fn>
double time_once(Fn&& fn) {
  const auto start = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace meshtensor::bench
