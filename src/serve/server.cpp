#include <iostream>
#include <optional>

#include <fmt/format.h>

#include <meshtensor/comm/agree.hpp>
#include <meshtensor/core/error.hpp>
#include <meshtensor/serve/server.hpp>

#include "http_frontend.hpp"
#include "model_host.hpp"

namespace meshtensor::serve {

void ServeControl::drain() {
  const std::lock_guard lock(mutex_);
  if (scheduler_ != nullptr) {
    scheduler_->drain();
  } else {
    drain_pending_ = true;
  }
}

void ServeControl::reload() {
  const std::lock_guard lock(mutex_);
  if (scheduler_ != nullptr) {
    (void)scheduler_->reload();
  } else {
    reload_pending_ = true;
  }
}

void ServeControl::attach(Scheduler* scheduler) {
  const std::lock_guard lock(mutex_);
  scheduler_ = scheduler;
  if (scheduler_ == nullptr) return;
  if (std::exchange(reload_pending_, false)) (void)scheduler_->reload();
  if (std::exchange(drain_pending_, false)) scheduler_->drain();
}

namespace {

/// What rank 0 serves of the host's model.
ServedModel served_model(ModelHost& host) {
  return {nn::with_context(host.config(), host.batch().cache_positions()),
          nn::decoder_spec_text(host.config()), host.tokenizer(), host.directory(),
          chat_support(host.tokenizer())};
}

/// Carries out a plan on this rank; false when it says to leave. On rank 0, `scheduler` and
/// `http` hear what happened.
bool run_plan(StepPlan& plan, ModelHost& host, Scheduler* scheduler, HttpFrontend* http) {
  if (plan.exit) return false;
  if (plan.reload) {
    const ReloadResult result = host.reload();
    if (scheduler != nullptr) {
      if (result.ok) http->set_model(served_model(host));
      scheduler->reloaded(result);
    }
    return true;
  }
  generate::ContinuousBatch& batch = host.batch();
  for (const std::uint64_t id : plan.remove)
    batch.remove(id);
  for (Admission& admission : plan.add)
    batch.add(admission.id, std::move(admission.request));
  if (batch.size() == 0) return true;
  const std::vector<generate::StepEvent> events = batch.step();
  if (scheduler != nullptr) scheduler->deliver(events);
  return true;
}

/// Rank 0's loop: plans each step from the scheduler and sends the plan to the other ranks
/// (an empty plan each second when idle keeps their waits short of the collective timeout).
void lead(comm::Communicator& world, ModelHost& host, Scheduler& scheduler, HttpFrontend& http) {
  const auto idle_wait =
      world.size() > 1 ? std::chrono::milliseconds(1000) : std::chrono::milliseconds(60000);
  for (;;) {
    StepPlan plan = scheduler.next_plan(host.batch().size(), host.batch().free_slots(), idle_wait);
    if (world.size() > 1) comm::broadcast_text(world, encode_plan(plan), 0);
    if (!run_plan(plan, host, &scheduler, &http)) return;
  }
}

/// The other ranks' loop: each step as rank 0 planned it.
void follow(comm::Communicator& world, ModelHost& host) {
  for (;;) {
    StepPlan plan = decode_plan(comm::broadcast_text(world, std::string(), 0));
    if (!run_plan(plan, host, nullptr, nullptr)) return;
  }
}

}  // namespace

void serve(comm::Communicator& world, const ServeConfig& config, ServeControl* control) {
  if (config.max_batch < 1 || config.max_queue < 1 || config.prefill_chunk < 1) {
    throw InvalidArgument(
        fmt::format("serve: max_batch {}, max_queue {} and prefill_chunk {} must be >= 1",
                    config.max_batch, config.max_queue, config.prefill_chunk));
  }
  if (!config.chat_template.empty()) {
    // A template given to the server is checked before the model loads.
    try {
      (void)tokenize::ChatTemplate(config.chat_template);
    } catch (const ParseError& e) {
      throw ParseError(fmt::format("{}: {}", config.chat_template_origin, e.what()));
    }
  }
  ModelHost host(world, config);
  std::optional<nn::BatchVariantScope> batch_variant;
  if (config.batch_variant) batch_variant.emplace(config.batch_variant);
  if (world.rank() != 0) return follow(world, host);

  Metrics metrics;
  Scheduler scheduler({config.max_batch, config.max_queue}, metrics);
  scheduler.set_weights_step(host.step());
  const ServedModel served = served_model(host);
  if (!served.chat.format && !served.tokenizer->chat_template().empty())
    std::cerr << "serve: /v1/chat/completions is refused: " << served.chat.missing << '\n';
  HttpFrontend http(config, scheduler, metrics, served);
  http.start();
  if (config.on_listening) config.on_listening(http.url());
  if (control != nullptr) control->attach(&scheduler);
  try {
    lead(world, host, scheduler, http);
  } catch (const std::exception& e) {
    if (control != nullptr) control->attach(nullptr);
    scheduler.fail_all(fmt::format("the generation loop failed: {}", e.what()));
    http.stop(std::chrono::seconds(5));
    throw;
  }
  if (control != nullptr) control->attach(nullptr);
  http.stop(config.drain_timeout);
}

}  // namespace meshtensor::serve
