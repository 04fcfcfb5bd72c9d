#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include <meshtensor/comm/communicator.hpp>

namespace meshtensor::bench {

/// What `meshtensor bench collective` times.
struct CollectiveBenchConfig {
  comm::CollectiveKind op = comm::CollectiveKind::all_reduce;
  DType dtype = DType::f32;
  /// Elements: the all_reduce buffer, the reduce_scatter input, the all_gather output, the
  /// all_to_all input of each rank (split over the ranks as evenly as possible).
  std::int64_t count = 1 << 24;
  /// Modes timed against native (reducing ops; the others move data the same in every mode).
  std::vector<comm::ReductionMode> modes = {comm::ReductionMode::ordered};
  /// Timed calls per mode; 0 picks about two seconds' worth (at least 5, at most 20000).
  int iterations = 0;
};

/// One mode's timing.
struct ModeTiming {
  comm::ReductionMode mode = comm::ReductionMode::ordered;
  double time_s = 0;     ///< median time per call
  double ratio = 0;      ///< median over calls of (this call / the native call next to it)
  double algbw_gbs = 0;  ///< bytes / time_s
  double busbw_gbs = 0;  ///< algbw scaled by the collective's bus factor (as nccl-tests)
};

/// Timings of one configuration, the same on every rank.
struct CollectiveBenchResult {
  int ranks = 0;
  int iterations = 0;
  double native_time_s = 0;       ///< median time per call of the backend's native collective
  std::vector<ModeTiming> modes;  ///< in the order of the config's modes
};

/// Times config.op in each of config.modes and in native mode, interleaved call by call, on
/// `comm` (collective: every rank calls it). Each call starts from the same input, after a
/// barrier; a call's time is the slowest rank's.
CollectiveBenchResult time_collective(comm::Communicator& comm,
                                      const CollectiveBenchConfig& config);

/// Bytes each rank holds for one configuration (inputs, outputs and the pristine copy), to check
/// against the memory available before allocating.
double collective_bench_bytes_per_rank(const CollectiveBenchConfig& config, int ranks);

/// Time for the machine to read `bytes` and write them once, as `threads` threads each copying
/// an equal share between private buffers (median of several runs).
double copy_time_s(std::int64_t bytes, int threads);

}  // namespace meshtensor::bench
