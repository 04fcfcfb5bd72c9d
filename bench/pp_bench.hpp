#pragma once

#include <cstdint>
#include <string>

#include "train_bench.hpp"

namespace meshtensor::bench {

/// `meshtensor bench pp`: each schedule's bubble on the simulated `link` (compute replayed from
/// one rank's timing, `rounds` steps), real pipelined steps on `stages` ranks against one rank,
/// and activation checkpointing's memory and step time (`checkpointing_rounds` alternated runs).
struct PipelineBenchConfig {
  TrainingBenchInput input;  ///< a GPT; its config's schedule and micro-batches
  std::int64_t stages = 4;
  bool micro_batches_given = false;  ///< false: 2 micro-batches per stage
  std::string link = "20us,10";
  std::int64_t rounds = 5;
  std::int64_t checkpointing_rounds = 3;
};

/// Runs and prints `bench pp`; 0, or 1 when exact digests differ.
int run_pp_bench(const PipelineBenchConfig& bench);

}  // namespace meshtensor::bench
