#pragma once

#include <cstdint>
#include <optional>

#include <meshtensor/comm/communicator.hpp>

namespace meshtensor::bench {

/// What `meshtensor bench collective` times.
struct CollectiveBenchConfig {
  comm::CollectiveKind op = comm::CollectiveKind::all_reduce;
  DType dtype = DType::f32;
  /// Elements: the all_reduce buffer, the reduce_scatter input, the all_gather output, the
  /// all_to_all input of each rank (split over the ranks as evenly as possible).
  std::int64_t count = 1 << 24;
  comm::ReductionMode mode = comm::ReductionMode::ordered;
  /// Timed calls per mode; 0 picks enough for about a second (at least 3).
  int iterations = 0;
};

/// Timings of one configuration, the same on every rank.
struct CollectiveBenchResult {
  int ranks = 0;
  int iterations = 0;
  double time_s = 0;         ///< median time per call in the requested mode
  double native_time_s = 0;  ///< median time per call of the backend's native collective
  double ratio = 0;          ///< time_s / native_time_s
  double algbw_gbs = 0;      ///< bytes / time_s
  double busbw_gbs = 0;      ///< algbw scaled by the collective's bus factor (as nccl-tests)
};

/// Times config.op in config.mode and in native mode, interleaved, on `comm` (collective: every
/// rank calls it). Each call starts from the same input, after a barrier; a call's time is the
/// slowest rank's.
CollectiveBenchResult time_collective(comm::Communicator& comm,
                                      const CollectiveBenchConfig& config);

/// Time for the machine to read `bytes` and write them once, as `threads` threads each copying
/// an equal share between private buffers (median of several runs).
double copy_time_s(std::int64_t bytes, int threads);

}  // namespace meshtensor::bench
