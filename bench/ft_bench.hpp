#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace meshtensor::bench {

/// `meshtensor bench ft`: replica groups run as child processes of this binary (`train`) with a
/// coordinator in this process.
struct FtBenchConfig {
  std::string model = "gpt";     ///< the groups' model (--model)
  std::int64_t batch = 16;       ///< global batch
  std::int64_t cost_steps = 20;  ///< steps of each run the quorum's cost is timed over
  int repeats = 3;               ///< alternated runs with and without the coordinator
  std::int64_t steps = 40;       ///< steps of the failure run
  int groups = 3;                ///< groups of the failure run (1 rank each)
  double timeout = 10.0;         ///< --replica-timeout and the coordinator's heartbeat timeout
};

/// What a failure did to the run.
struct FailureFigures {
  std::string what;              ///< "SIGKILL of group 1", ...
  std::int64_t step = 0;         ///< the quorum's step when it happened
  double next_step_seconds = 0;  ///< from the failure to the survivors' next completed step
};

/// What a restarted group took to join.
struct HealFigures {
  int group = 0;
  double first_step_seconds = 0;  ///< from its start to its first completed step
  double heal_seconds = 0;        ///< of which receiving and restoring the state
  std::int64_t healed_to = 0;     ///< the step it took
};

struct FtBenchResult {
  double plain_step_seconds = 0;   ///< median step of a run without a coordinator
  double quorum_step_seconds = 0;  ///< ... of the same run as one replica group
  double median_step_seconds = 0;  ///< the failure run's median step (a surviving group)
  std::vector<FailureFigures> failures;
  std::vector<HealFigures> heals;
  std::vector<std::string> digests;  ///< every finishing group's weights digest
  std::string uninterrupted_digest;  ///< the run's on one group without failures
};

/// Runs the benchmark (`binary`: this program, to start the groups with).
FtBenchResult run_ft_bench(const FtBenchConfig& config, const std::string& binary);

}  // namespace meshtensor::bench
