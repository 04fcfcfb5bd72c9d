#include <meshtensor/comm/communicator.hpp>
#include <meshtensor/core/digest.hpp>
#include <meshtensor/rl/result_json.hpp>
#include <meshtensor/train/settings.hpp>
#include <meshtensor/train/text_data.hpp>

namespace meshtensor::rl {

namespace {

nlohmann::json samples_json(const std::vector<RlSample>& samples) {
  nlohmann::json out = nlohmann::json::array();
  for (const RlSample& s : samples) {
    out.push_back({{"prompt", train::printable_text(s.prompt)},
                   {"completion", train::printable_text(s.completion)},
                   {"reward", s.reward}});
  }
  return out;
}

/// One figure of every step, by name.
void add_series(nlohmann::json& out, const std::vector<RlStepReport>& steps) {
  const std::pair<const char*, double RlStepReport::*> series[] = {
      {"reward_mean", &RlStepReport::reward_mean},
      {"kl_mean", &RlStepReport::kl_mean},
      {"loss", &RlStepReport::loss},
      {"sync_seconds", &RlStepReport::sync_seconds},
      {"generate_seconds", &RlStepReport::generate_seconds},
      {"train_seconds", &RlStepReport::train_seconds}};
  for (const auto& [name, field] : series) {
    nlohmann::json values = nlohmann::json::array();
    for (const RlStepReport& r : steps)
      values.push_back(r.*field);
    out[name] = values;
  }
}

}  // namespace

nlohmann::json step_json(const RlStepReport& r) {
  return {{"step", r.step},
          {"reward_mean", r.reward_mean},
          {"tokens", r.tokens},
          {"identical", r.identical},
          {"max_abs_diff", r.max_abs_diff},
          {"kl_mean", r.kl_mean},
          {"loss", r.loss},
          {"clipped_fraction", r.clipped_fraction},
          {"generate_seconds", r.generate_seconds},
          {"train_seconds", r.train_seconds},
          {"sync_seconds", r.sync_seconds},
          {"sync_collectives", r.sync.collectives},
          {"sync_bytes_per_rank", r.sync.bytes_per_rank}};
}

nlohmann::json result_json(const RlResult& result, const RlConfig& config) {
  nlohmann::json out = {
      {"final", true},
      {"weights_digest", digest_hex(result.weights_digest)},
      {"steps", result.resumed_step + static_cast<std::int64_t>(result.steps.size())},
      {"resumed_step", result.resumed_step},
      {"parity",
       {{"tokens", result.tokens},
        {"identical", result.identical},
        {"max_abs_diff", result.max_abs_diff}}},
      {"trainer_layout", result.trainer_layout},
      {"generator_layout", result.generator_layout},
      {"joint_mesh", result.joint_mesh},
      {"mode", std::string(comm::reduction_mode_name(config.train.mode))},
      {"parameters", result.parameters},
      {"parameter_tensors", result.parameter_tensors},
      {"samples_before", samples_json(result.before)},
      {"samples_after", samples_json(result.after)},
      {"checkpoints", result.checkpoints},
      {"seconds", result.seconds},
      {"trainer_settings", train::settings_json(config.train)}};
  add_series(out, result.steps);
  nlohmann::json reports = nlohmann::json::array();
  for (const RlStepReport& r : result.steps)
    reports.push_back(step_json(r));
  out["step_reports"] = reports;
  out["sync"] = result.steps.empty()
                    ? nlohmann::json{{"collectives", 0}, {"bytes_per_rank", 0}}
                    : nlohmann::json{{"collectives", result.steps.back().sync.collectives},
                                     {"bytes_per_rank", result.steps.back().sync.bytes_per_rank}};
  nlohmann::json naive = nlohmann::json::array();
  if (config.compare_naive_sync) {
    for (const RlStepReport& r : result.steps)
      naive.push_back(r.naive_sync_seconds);
  }
  out["naive_sync_seconds"] = naive;
  return out;
}

}  // namespace meshtensor::rl
