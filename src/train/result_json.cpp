#include <algorithm>
#include <thread>

#include <meshtensor/comm/communicator.hpp>
#include <meshtensor/core/digest.hpp>
#include <meshtensor/core/memory.hpp>
#include <meshtensor/fsdp/memory.hpp>
#include <meshtensor/kernels/peak.hpp>
#include <meshtensor/pp/stage.hpp>
#include <meshtensor/train/result_json.hpp>
#include <meshtensor/train/settings.hpp>
#include <meshtensor/train/task.hpp>
#include <meshtensor/train/text_data.hpp>

namespace meshtensor::train {

namespace {
// The median of per-step figures after the first `warmup` steps (at least one kept; 0 for none).
double steady_median(std::vector<double> values, std::size_t warmup) {
  if (values.empty()) return 0.0;
  values.erase(values.begin(),
               values.begin() + static_cast<std::ptrdiff_t>(std::min(warmup, values.size() - 1)));
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

nlohmann::json memory_json(const fsdp::MemoryTracker::Snapshot& peak) {
  nlohmann::json memory;
  for (std::size_t k = 0; k < fsdp::kMemoryKinds; ++k)
    memory[fsdp::memory_kind_name(static_cast<fsdp::MemoryKind>(k))] = peak.bytes[k];
  memory["total"] = peak.total();
  return memory;
}

nlohmann::json pipeline_json(const TrainResult& result) {
  if (result.pipeline.stages == 0) return nullptr;
  const auto& p = result.pipeline;
  return {{"stages", p.stages},
          {"schedule", p.schedule},
          {"micro_batches", p.micro_batches},
          {"stage_units", p.stage_units},
          {"theoretical_bubble", p.theoretical_bubble},
          {"measured_bubble", steady_median(p.step_bubbles, 1)}};
}
}  // namespace

nlohmann::json epoch_json(const EpochReport& e, const Task& task) {
  const std::string eval = task.eval_name();
  nlohmann::json out = {{"epoch", e.epoch},
                        {"steps", e.steps},
                        {"train_loss", e.train_loss},
                        {"train_accuracy", e.train_accuracy},
                        {eval + "_loss", e.test_loss},
                        {eval + "_accuracy", e.test_accuracy},
                        {"samples_per_second", e.samples_per_second},
                        {"seconds", e.seconds}};
  if (task.target_name() == "token") out["tokens_per_second"] = e.targets_per_second;
  if (const auto bits = bits_per_byte(e.test_loss, task); bits && task.eval_samples() > 0)
    out[eval + "_bits_per_byte"] = *bits;
  return out;
}

Utilisation utilisation(const Task& task, const TrainConfig& config, std::int64_t ranks,
                        double step_seconds) {
  Utilisation u;
  u.model_flops_per_target = task.footprint().training_flops_per_target;
  const double targets = static_cast<double>(std::min(config.batch, task.samples())) *
                         static_cast<double>(task.targets_per_sample());
  if (step_seconds > 0)
    u.model_flops_per_second = u.model_flops_per_target * targets / step_seconds;
  const auto cores = static_cast<double>(
      std::min<std::int64_t>(ranks, std::max(1U, std::thread::hardware_concurrency())));
  // bf16 compute against the bf16 dot-product peak where its products run on it.
  const DType compute = config.param_dtype == DType::bf16 ? DType::bf16 : DType::f32;
  u.peak_flops_per_second = kernels::measured_compute_peak_per_core(compute) * cores;
  u.mfu = u.peak_flops_per_second > 0 ? u.model_flops_per_second / u.peak_flops_per_second : 0;
  return u;
}

nlohmann::json result_json(const TrainResult& result, const Task& task, const TrainConfig& config,
                           std::int64_t ranks) {
  const std::string eval = task.eval_name();
  nlohmann::json epochs = nlohmann::json::array();
  for (const EpochReport& report : result.epochs)
    epochs.push_back(epoch_json(report, task));
  nlohmann::json plan = nlohmann::json::array();
  for (const auto& [module, style] : result.parallel_plan)
    plan.push_back({module, style});
  nlohmann::json out = {
      {"final", true},
      {"eval_set", eval},
      {eval + "_loss", result.test_loss},
      {eval + "_accuracy", result.test_accuracy},
      {"digest", digest_hex(result.digest)},
      {"replicas_identical", result.replicas_identical},
      {"ranks", ranks},
      {"mesh", result.mesh},
      {"mode", comm::reduction_mode_name(config.mode)},
      {"steps", result.steps},
      {"parameters", result.parameters},
      {"parameter_tensors", result.parameter_tensors},
      {"peak_memory_bytes", memory_json(result.memory_peak)},
      {"process_peak_resident_bytes", peak_resident_bytes()},
      {"resumed_step", result.resumed_step},
      {"checkpoints", result.checkpoints},
      {"warnings", result.warnings},
      {"seconds", result.seconds},
      {"settings", settings_json(config)},
      {"epochs", epochs},
      {"sample", task.target_name() == "token" ? nlohmann::json(printable_text(result.sample))
                                               : nlohmann::json(nullptr)},
      {"logits_digest", result.evaluated ? nlohmann::json(digest_hex(result.logits_digest))
                                         : nlohmann::json(nullptr)},
      {"grad_norms", result.grad_norms},
      {"grad_norm", result.grad_norms.empty() ? nlohmann::json(nullptr)
                                              : nlohmann::json(result.grad_norms.back())},
      {"activation_checkpointing", pp::checkpointing_name(config.activation_checkpointing)},
      {"activation_peak_bytes", result.activation_peaks.empty()
                                    ? std::vector<std::int64_t>{result.activation_peak_bytes}
                                    : result.activation_peaks},
      {"pipeline", pipeline_json(result)},
      {"healed_steps", result.healed_steps},
      {"heal_seconds", result.heal_seconds},
      {"step_end_times", result.step_end_times},
      {"parallel_plan", plan},
      {"parallel_log", result.parallel_log}};
  if (result.step_seconds.size() > 2) {
    const Utilisation u = utilisation(task, config, ranks, steady_median(result.step_seconds, 2));
    out["model_flops_per_target"] = u.model_flops_per_target;
    out["model_flops_per_second"] = u.model_flops_per_second;
    out["peak_flops_per_second"] = u.peak_flops_per_second;
    out["mfu"] = u.mfu;
  }
  if (result.profiled_steps > 0) {
    const auto steps = static_cast<double>(result.profiled_steps);
    nlohmann::json rows = nlohmann::json::object();
    for (std::size_t r = 0; r < kProfileRows; ++r)
      rows[std::string(profile_row_name(static_cast<ProfileRow>(r)))] = result.profile[r] / steps;
    out["profile"] = {{"steps", result.profiled_steps},
                      {"step_seconds", result.profiled_seconds / steps},
                      {"seconds_per_step", rows}};
  }
  if (const auto bits = bits_per_byte(result.test_loss, task); bits && result.evaluated)
    out[eval + "_bits_per_byte"] = *bits;
  out["generator_check"] = nullptr;
  if (config.verify_generator) {
    const auto& check = result.generator_check;
    out["generator_check"] = {{"tokens", check.tokens},
                              {"identical", check.identical},
                              {"largest_difference", check.largest_difference}};
  }
  return out;
}

}  // namespace meshtensor::train
