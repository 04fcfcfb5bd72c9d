#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "train_bench.hpp"

namespace meshtensor::bench {

/// `meshtensor bench cp`: context parallelism. Per-rank attention work and time of each cp
/// degree's head-tail and contiguous splits (the attention kernels timed on each rank's rows, one
/// head), real training steps on each degree against cp 1 with and without the simulated `link`
/// (step time, exposed communication, activation peak per rank, digests), and the longest
/// context each degree trains within `memory_limit` bytes of activations per rank.
struct ContextBenchConfig {
  TrainingBenchInput input;  ///< a decoder; its context is the sequence length benched
  std::vector<std::int64_t> degrees = {2, 4};
  std::string link = "20us,10";
  std::int64_t rounds = 3;
  std::int64_t memory_limit = std::int64_t{1} << 30;
};

/// Runs and prints `bench cp`; 0, or 1 when exact digests differ.
int run_cp_bench(const ContextBenchConfig& bench);

}  // namespace meshtensor::bench
