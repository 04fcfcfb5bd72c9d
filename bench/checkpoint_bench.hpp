#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace meshtensor::bench {

/// What `meshtensor bench checkpoint` measures.
struct CheckpointBenchConfig {
  int ranks = 8;  ///< thread ranks saving and loading
  std::int64_t megabytes =
      1024;               ///< model state: this many MiB of 4096-column f32 matrices of 4093 rows
  int repeats = 3;        ///< each figure is the median over this many runs
  std::string directory;  ///< where to write (a temporary directory under it)
};

/// One timed operation: median seconds and the bytes it moved.
struct CheckpointTiming {
  std::string name;
  double seconds = 0.0;
  std::int64_t bytes = 0;
  /// Data bytes each rank read (loads only), and what its target blocks hold.
  std::vector<std::int64_t> bytes_read_per_rank;
  std::vector<std::int64_t> target_bytes_per_rank;
  double gigabytes_per_second() const {
    return seconds > 0 ? static_cast<double>(bytes) / seconds / 1e9 : 0.0;
  }
};

/// The figures: the sequential baselines, the save, and loads onto the same and other layouts.
struct CheckpointBenchResult {
  CheckpointTiming baseline_write;    ///< one file, 8 MiB writes, fsync
  CheckpointTiming baseline_read;     ///< that file read back into one touched buffer of its size
  CheckpointTiming baseline_fresh;    ///< the same into newly allocated memory (page faults)
  CheckpointTiming baseline_discard;  ///< read again through one reused 8 MiB buffer (dd)
  CheckpointTiming save;              ///< Shard(0) blocks of every rank, fsync, rename, LATEST
  CheckpointTiming load_same;         ///< onto the layout it was saved from
  CheckpointTiming load_nested;       ///< onto a 2 x (ranks/2) mesh split (Shard(0), Shard(0))
  CheckpointTiming load_other_dim;    ///< onto Shard(1) over the same ranks: strided reads
  CheckpointTiming load_hsdp;         ///< onto a 2 x (ranks/2) mesh (Replicate, Shard(0))
  std::int64_t tensors = 0;
};

/// Runs the benchmark.
CheckpointBenchResult run_checkpoint_bench(const CheckpointBenchConfig& config);

}  // namespace meshtensor::bench
