#pragma once

#include <nlohmann/json.hpp>

#include <meshtensor/rl/grpo.hpp>

namespace meshtensor::rl {

/// One step's report as JSON: step, reward_mean, tokens, identical, max_abs_diff, kl_mean, loss,
/// clipped_fraction, the three timings and the weight sync's collectives and bytes per rank.
/// What Python's on_step receives and each entry of the result's "step_reports".
nlohmann::json step_json(const RlStepReport& report);

/// The result of an RL run as JSON: the one schema of `meshtensor rl --json`'s final object and
/// of Python's `mt.rl()` (docs/rl.md lists the keys). `config` is the run's.
nlohmann::json result_json(const RlResult& result, const RlConfig& config);

}  // namespace meshtensor::rl
