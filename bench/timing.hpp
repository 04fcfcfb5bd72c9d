#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <string>
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

/// The median of per-step figures after the first `warmup` steps (which set things up and warm
/// caches; at least one value is kept); 0 when empty.
inline double steady_median(const std::vector<double>& values, std::size_t warmup) {
  if (values.empty()) return 0.0;
  const auto skip = static_cast<std::ptrdiff_t>(std::min(warmup, values.size() - 1));
  return median(std::vector<double>(values.begin() + skip, values.end()));
}

/// steady_median of step times after the first two (which allocate and warm the caches).
inline double steady_step_seconds(const std::vector<double>& steps) {
  return steady_median(steps, 2);
}

/// Indices of `values` from the smallest value to the largest (ties keep index order).
inline std::vector<std::size_t> order_by_size(const std::vector<double>& values) {
  std::vector<std::size_t> order(values.size());
  for (std::size_t i = 0; i < order.size(); ++i)
    order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return values[a] < values[b]; });
  return order;
}

/// Indices of the middle half of `values` by size: the n/4 smallest and n/4 largest dropped, and
/// at least the smallest and the largest of 3 or more, so that one outlier moves nothing.
inline std::vector<std::size_t> middle_half(const std::vector<double>& values) {
  const std::vector<std::size_t> order = order_by_size(values);
  const std::size_t n = values.size();
  const std::size_t drop = std::max<std::size_t>(n / 4, n >= 3 ? 1 : 0);
  return {order.begin() + static_cast<std::ptrdiff_t>(drop),
          order.end() - static_cast<std::ptrdiff_t>(drop)};
}

/// Prints "machine: <cpu model>, N hardware threads, kernels <level>, <measured_peak_text>" before
/// a benchmark's text output (nothing with `json`, whose objects carry it as "machine", nor on mpi
/// ranks other than 0): every figure names the CPU it was measured on.
void print_machine_line(bool json);

/// "f32 FMA peak N GFLOP/s a core at <level> (measured; bench peak)": one short measurement of
/// kernels::fma_flops_per_second at the kernels' level, made once a process.
std::string measured_peak_text();

/// Seconds one call of `fn` takes.
template <class Fn>
double time_once(Fn&& fn) {
  const auto start = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace meshtensor::bench
