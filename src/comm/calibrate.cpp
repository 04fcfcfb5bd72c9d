#include <algorithm>
#include <chrono>
#include <vector>

#include <meshtensor/comm/calibrate.hpp>

namespace meshtensor::comm {

namespace {
using Clock = std::chrono::steady_clock;

template <typename Body>
double median_seconds(int repeats, const Body& body) {
  std::vector<double> times;
  for (int i = 0; i < repeats; ++i) {
    const Clock::time_point start = Clock::now();
    body();
    times.push_back(std::chrono::duration<double>(Clock::now() - start).count());
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}
}  // namespace

LocalCosts measure_local_costs(Communicator& world) {
  constexpr int kBarriers = 15;
  constexpr int kCopies = 5;
  constexpr std::int64_t kCopyBytes = std::int64_t{4} << 20;
  world.barrier();  // every rank starts together
  const double barrier_s = median_seconds(kBarriers, [&] { world.barrier(); });
  // Every rank copies at once and the copies end at a barrier: ranks sharing cores (threads on
  // a small machine) see the time their copies take together, as a collective's copies do.
  const Tensor from = Tensor::full({kCopyBytes / 4}, DType::f32, 1.0);
  Tensor to({kCopyBytes / 4}, DType::f32);
  const double copy_s = median_seconds(kCopies, [&] {
    world.barrier();
    to.copy_from(from);
    world.barrier();
  });
  Tensor slowest = Tensor::full({2}, DType::f64, 0.0);
  slowest.values<double>()[0] = barrier_s;
  slowest.values<double>()[1] = copy_s - 2 * barrier_s;
  CollectiveOptions max;
  max.op = ReduceOp::max;
  world.all_reduce(slowest, max);
  LocalCosts costs;
  costs.per_collective_s = slowest.values<double>()[0];
  costs.memory_bandwidth_bytes_s =
      static_cast<double>(kCopyBytes) / std::max(slowest.values<double>()[1], 1e-6);
  return costs;
}

}  // namespace meshtensor::comm
