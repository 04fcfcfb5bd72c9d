#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <meshtensor/nn/models.hpp>

namespace meshtensor::bench {

/// What `meshtensor bench rl` measures.
struct RlBenchConfig {
  int ranks = 4;                 ///< thread ranks of the sync comparison and the spread run
  std::string link = "20us,10";  ///< the simulated link of those runs
  nn::DecoderSpec model;         ///< the policy (fresh weights; the default GPT by default)
  int repeats = 5;               ///< syncs timed per layout pair (median)
  int steps = 4;                 ///< RL steps of each step-share run (the first is not counted)
};

/// One pair of layouts: the planner's sync against gather-on-rank-0-then-broadcast.
struct SyncComparison {
  std::string trainer;
  std::string generator;
  double planner_seconds = 0;
  double naive_seconds = 0;
  std::int64_t planner_collectives = 0;
  std::int64_t planner_bytes_per_rank = 0;
  std::int64_t naive_collectives = 0;
  std::int64_t naive_bytes_per_rank = 0;
};

/// The share of an RL step the sync takes, on one setting.
struct StepShare {
  std::string setting;
  double step_seconds = 0;  ///< median over the steps after the first
  double sync_seconds = 0;
  double generate_seconds = 0;
  double train_seconds = 0;
};

/// Everything `meshtensor bench rl` prints.
struct RlBenchResult {
  std::vector<SyncComparison> syncs;
  std::vector<StepShare> steps;
  std::int64_t rollout_batch = 0;          ///< completions of a step, decoded together
  double rollout_tokens_per_second = 0;    ///< generation inside the RL step (1 rank)
  double generator_tokens_per_second = 0;  ///< the same requests through a Generator alone
};

/// Runs the comparisons: syncs between layouts on `ranks` thread ranks over the link; RL steps
/// of the words task (Debian's fortunes and word list) on 1 rank and spread over `ranks`; the
/// rollout's decode speed against the generator alone on the same requests.
RlBenchResult run_rl_bench(const RlBenchConfig& config);

}  // namespace meshtensor::bench
