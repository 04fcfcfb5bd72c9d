#include "collective_bench.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include <meshtensor/core/error.hpp>

#include "timing.hpp"

namespace meshtensor::bench {

namespace {

using Clock = std::chrono::steady_clock;
using comm::CollectiveKind;
using comm::Communicator;
using comm::ReductionMode;

// Buffers of one rank for one collective, refreshed from a pristine copy before each call.
struct Buffers {
  Tensor pristine;
  Tensor input;
  Tensor output;
  std::vector<std::int64_t> counts;
};

Buffers make_buffers(const CollectiveBenchConfig& config, int rank, int size) {
  Buffers b;
  const auto seed = static_cast<std::uint64_t>(rank) + 1;
  const std::vector<std::int64_t> counts = comm::balanced_counts(config.count, size);
  const std::int64_t mine = counts[static_cast<std::size_t>(rank)];
  // Random values: up to 1M of them drawn, then repeated (drawing billions of normal samples
  // would take longer than the timing).
  auto random = [&](std::int64_t n) {
    constexpr std::int64_t kDrawn = 1 << 20;
    const std::int64_t drawn = std::min(n, kDrawn);
    Tensor pattern = is_floating(config.dtype)
                         ? Tensor::random_normal({drawn}, config.dtype, seed)
                         : Tensor::random_int({drawn}, config.dtype, seed, -100, 100);
    if (drawn == n) return pattern;
    Tensor out({n}, config.dtype);
    for (std::int64_t begin = 0; begin < n; begin += drawn) {
      out.narrow(0, begin, std::min(drawn, n - begin))
          .copy_from(pattern.narrow(0, 0, std::min(drawn, n - begin)));
    }
    return out;
  };
  switch (config.op) {
    case CollectiveKind::all_reduce:
      b.pristine = random(config.count);
      b.input = b.pristine.clone();
      b.output = b.input;
      break;
    case CollectiveKind::reduce_scatter:
      b.pristine = random(config.count);
      b.input = b.pristine;
      b.output = Tensor({mine}, config.dtype);
      b.counts = counts;
      break;
    case CollectiveKind::all_gather:
      b.pristine = random(mine);
      b.input = b.pristine;
      b.output = Tensor({config.count}, config.dtype);
      b.counts = counts;
      break;
    case CollectiveKind::all_to_all:
      b.pristine = random(config.count);
      b.input = b.pristine;
      b.output = Tensor({config.count}, config.dtype);
      b.counts = counts;  // the same split in both directions keeps the totals equal
      break;
    default:
      throw InvalidArgument(
          fmt::format("bench collective: --op {} is not timed", comm::collective_name(config.op)));
  }
  return b;
}

void run_once(Communicator& comm, const CollectiveBenchConfig& config, Buffers& b,
              ReductionMode mode) {
  const comm::CollectiveOptions options{.mode = mode};
  switch (config.op) {
    case CollectiveKind::all_reduce:
      comm.all_reduce(b.input, options);
      return;
    case CollectiveKind::reduce_scatter:
      comm.reduce_scatter(b.input, b.output, b.counts, options);
      return;
    case CollectiveKind::all_gather:
      comm.all_gather(b.input, b.output, b.counts, options);
      return;
    case CollectiveKind::all_to_all:
      comm.all_to_all(b.input, b.output, b.counts, b.counts, options);
      return;
    default:
      return;
  }
}

// nccl-tests' bus factors: the share of the data each rank must send or receive.
double bus_factor(CollectiveKind op, int size) {
  const double n = size;
  if (op == CollectiveKind::all_reduce) return 2 * (n - 1) / n;
  return (n - 1) / n;
}

}  // namespace

double collective_bench_bytes_per_rank(const CollectiveBenchConfig& config, int ranks) {
  const double bytes =
      static_cast<double>(config.count) * static_cast<double>(dtype_size(config.dtype));
  const double share = bytes / ranks + static_cast<double>(dtype_size(config.dtype));
  switch (config.op) {
    case CollectiveKind::all_reduce:
      return 2 * bytes + bytes;  // pristine, buffer, and the backend's staging at worst
    case CollectiveKind::reduce_scatter:
      return bytes + share + bytes;
    case CollectiveKind::all_gather:
      return share + bytes;
    default:
      return 3 * bytes;  // all_to_all: pristine input, output, staging
  }
}

CollectiveBenchResult time_collective(Communicator& comm, const CollectiveBenchConfig& config) {
  if (config.count < 1) {
    throw InvalidArgument(
        fmt::format("bench collective: --count must be positive, not {}", config.count));
  }
  Buffers b = make_buffers(config, comm.rank(), comm.size());
  // One timed call: restore the input, line the ranks up, time, and take the slowest rank.
  auto timed = [&](ReductionMode mode) {
    if (config.op == CollectiveKind::all_reduce) b.input.copy_from(b.pristine);
    comm.barrier();
    const auto start = Clock::now();
    run_once(comm, config, b, mode);
    const double mine = std::chrono::duration<double>(Clock::now() - start).count();
    Tensor slowest = Tensor::full({1}, DType::f64, mine);
    comm.all_reduce(slowest, {.op = ReduceOp::max});
    return slowest.values<double>()[0];
  };
  const bool reducing =
      config.op == CollectiveKind::all_reduce || config.op == CollectiveKind::reduce_scatter;
  std::vector<ReductionMode> modes = config.modes;
  if (!reducing) modes.resize(std::min<std::size_t>(modes.size(), 1));  // same data movement
  // Warm-up: first-touch pages, MPI connections, staging buffers.
  timed(ReductionMode::native);
  for (ReductionMode mode : modes)
    timed(mode);

  std::vector<double> native_times;
  std::vector<std::vector<double>> times(modes.size());
  double spent = 0;
  while (true) {
    native_times.push_back(timed(ReductionMode::native));
    spent += native_times.back();
    for (std::size_t m = 0; m < modes.size(); ++m) {
      times[m].push_back(timed(modes[m]));
      spent += times[m].back();
    }
    // Enough rounds for a stable median: about two seconds' worth, at least 5 (small messages
    // take thousands), at most 20000. `spent` is the same on every rank (slowest-rank times).
    const auto done = static_cast<int>(native_times.size());
    if (config.iterations > 0 ? done >= config.iterations
                              : done >= 5 && (spent >= 2.0 || done >= 20000)) {
      break;
    }
  }
  CollectiveBenchResult result;
  result.ranks = comm.size();
  result.iterations = static_cast<int>(native_times.size());
  result.native_time_s = median(native_times);
  const double bytes =
      static_cast<double>(config.count) * static_cast<double>(dtype_size(config.dtype));
  for (std::size_t m = 0; m < modes.size(); ++m) {
    ModeTiming timing;
    timing.mode = modes[m];
    timing.time_s = median(times[m]);
    // Each call against the native call timed next to it, then the median: a drift in the
    // machine's speed during the run (frequent on shared or oversubscribed machines) cancels
    // out of every pair instead of skewing one median against the other.
    std::vector<double> ratios;
    for (std::size_t i = 0; i < native_times.size(); ++i)
      ratios.push_back(times[m][i] / native_times[i]);
    timing.ratio = median(ratios);
    timing.algbw_gbs = bytes / timing.time_s / 1e9;
    timing.busbw_gbs = timing.algbw_gbs * bus_factor(config.op, comm.size());
    result.modes.push_back(timing);
  }
  return result;
}

double copy_time_s(std::int64_t bytes, int threads) {
  const auto share = static_cast<std::size_t>(bytes / threads);
  std::vector<std::vector<std::byte>> from(static_cast<std::size_t>(threads),
                                           std::vector<std::byte>(share, std::byte{1}));
  std::vector<std::vector<std::byte>> to(static_cast<std::size_t>(threads),
                                         std::vector<std::byte>(share, std::byte{0}));
  std::vector<double> times;
  for (int run = 0; run < 5; ++run) {
    const auto start = Clock::now();
    std::vector<std::thread> workers;
    for (std::size_t t = 0; t < from.size(); ++t)
      workers.emplace_back([&, t] { std::memcpy(to[t].data(), from[t].data(), share); });
    for (std::thread& w : workers)
      w.join();
    times.push_back(std::chrono::duration<double>(Clock::now() - start).count());
  }
  return median(times);
}

}  // namespace meshtensor::bench
