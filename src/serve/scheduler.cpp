#include <algorithm>
#include <bit>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <meshtensor/core/error.hpp>
#include <meshtensor/generate/request_wire.hpp>
#include <meshtensor/serve/scheduler.hpp>

namespace meshtensor::serve {

namespace {

double seconds_between(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

}  // namespace

std::string encode_plan(const StepPlan& plan) {
  nlohmann::json add = nlohmann::json::array();
  for (const Admission& a : plan.add)
    add.push_back({{"id", a.id}, {"request", generate::request_to_json(a.request)}});
  return nlohmann::json{
      {"remove", plan.remove}, {"add", add}, {"reload", plan.reload}, {"exit", plan.exit}}
      .dump();
}

StepPlan decode_plan(const std::string& text) {
  const nlohmann::json doc = nlohmann::json::parse(text);
  StepPlan plan;
  plan.remove = doc.at("remove").get<std::vector<std::uint64_t>>();
  for (const nlohmann::json& a : doc.at("add"))
    plan.add.push_back(
        {a.at("id").get<std::uint64_t>(), generate::request_from_json(a.at("request"))});
  plan.reload = doc.at("reload").get<bool>();
  plan.exit = doc.at("exit").get<bool>();
  return plan;
}

Scheduler::Scheduler(SchedulerOptions options, Metrics& metrics)
    : options_(options), metrics_(metrics) {
  if (options_.max_batch < 1 || options_.max_queue < 1) {
    throw InvalidArgument(fmt::format("scheduler: max_batch {} and max_queue {} must be >= 1",
                                      options_.max_batch, options_.max_queue));
  }
}

void Scheduler::submit(const std::shared_ptr<Job>& job) {
  const std::size_t count = job->params.prompts.size() * static_cast<std::size_t>(job->params.n);
  {
    const std::lock_guard lock(mutex_);
    if (draining_) {
      throw ApiError{503, "The server is shutting down and takes no new requests", "server_error",
                     "", "server_shutting_down"};
    }
    if (static_cast<std::int64_t>(count) > options_.max_queue) {
      throw ApiError{400,
                     fmt::format("This request's {} choices (prompts × n) can never fit the "
                                 "server's queue of {}",
                                 count, options_.max_queue),
                     "invalid_request_error", "n", ""};
    }
    if (static_cast<std::int64_t>(waiting_.size() + count) > options_.max_queue) {
      throw ApiError{429,
                     fmt::format("The queue is full: {} choices wait and this request adds {} "
                                 "(at most {}); retry shortly",
                                 waiting_.size(), count, options_.max_queue),
                     "rate_limit_exceeded", "", "queue_full"};
    }
    {
      const std::lock_guard job_lock(job->mutex);
      job->choices.clear();
      for (const auto& prompt : job->params.prompts)
        for (std::int64_t j = 0; j < job->params.n; ++j)
          job->choices.push_back({prompt, {}, {}, std::nullopt, ""});
      job->unfinished = count;
    }
    for (std::size_t c = 0; c < count; ++c)
      waiting_.push_back({job, c, job->queued});
    publish_load();
  }
  work_.notify_all();
}

void Scheduler::cancel(const std::shared_ptr<Job>& job) {
  {
    const std::lock_guard lock(mutex_);
    std::erase_if(waiting_, [&](const Slot& s) { return s.job == job; });
    for (auto it = running_.begin(); it != running_.end();) {
      if (it->second.job == job) {
        to_remove_.push_back(it->first);
        it = running_.erase(it);
      } else {
        ++it;
      }
    }
    publish_load();
    const std::lock_guard job_lock(job->mutex);
    job->cancelled = true;
  }
  work_.notify_all();
}

void Scheduler::publish_load() {
  metrics_.set_load(static_cast<std::int64_t>(waiting_.size()),
                    static_cast<std::int64_t>(running_.size()));
}

void Scheduler::drain() {
  {
    const std::lock_guard lock(mutex_);
    draining_ = true;
  }
  work_.notify_all();
}

bool Scheduler::draining() const {
  const std::lock_guard lock(mutex_);
  return draining_;
}

std::shared_future<ReloadResult> Scheduler::reload() {
  std::shared_future<ReloadResult> result;
  {
    const std::lock_guard lock(mutex_);
    if (!reload_wanted_) {
      reload_waiters_.emplace_back();
      reload_future_ = reload_waiters_.back().get_future().share();
      reload_wanted_ = true;
    }
    result = reload_future_;
  }
  work_.notify_all();
  return result;
}

bool Scheduler::start_allowed() const {
  return !waiting_.empty() && (!reload_wanted_ || waiting_.front().job->started);
}

StepPlan Scheduler::next_plan(std::int64_t running, std::int64_t free_slots,
                              std::chrono::milliseconds idle_wait) {
  std::unique_lock lock(mutex_);
  const auto quiet = [&] { return running_.empty() && to_remove_.empty(); };
  const auto reload_now = [&] { return reload_wanted_ && quiet() && !start_allowed(); };
  const auto exit_now = [&] { return draining_ && waiting_.empty() && quiet(); };
  const auto ready = [&] {
    return running > 0 || !to_remove_.empty() || (start_allowed() && free_slots > 0) ||
           reload_now() || exit_now();
  };
  if (!ready()) work_.wait_for(lock, idle_wait, ready);
  StepPlan plan;
  plan.remove = std::exchange(to_remove_, {});
  if (exit_now()) {
    plan.exit = true;
    return plan;
  }
  if (reload_now()) {
    plan.reload = true;
    return plan;
  }
  free_slots += static_cast<std::int64_t>(plan.remove.size());
  for (; free_slots > 0 && start_allowed(); --free_slots) {
    Slot slot = std::move(waiting_.front());
    waiting_.pop_front();
    Job& job = *slot.job;
    const CompletionParams& params = job.params;
    if (!job.started) {
      job.started = true;
      {
        const std::lock_guard job_lock(job.mutex);
        job.header.weights_step = weights_step_;
        job.admitted = true;
        ++job.version;
      }
      job.notify();
    }
    const auto sample = static_cast<std::int64_t>(slot.choice) % params.n;
    generate::Request request;
    request.prompt = params.prompts[slot.choice / static_cast<std::size_t>(params.n)];
    request.max_new_tokens = params.max_tokens;
    request.sampling = params.sampling;
    request.sampling.seed += static_cast<std::uint64_t>(sample);
    request.score_prompt = params.echo && params.logprobs.has_value();
    request.top_logprobs = params.logprobs.value_or(0);
    request.stop_tokens = params.tokenizer->roles().end_ids;
    metrics_.add_prompt_tokens(static_cast<std::int64_t>(request.prompt.size()));
    const std::uint64_t id = next_id_++;
    plan.add.push_back({id, std::move(request)});
    running_.emplace(id, std::move(slot));
  }
  publish_load();
  return plan;
}

void Scheduler::finish_choice(Slot& slot, const std::string& reason) {
  Job& job = *slot.job;
  job.choices[slot.choice].finish_reason = reason;
  if (--job.unfinished == 0)
    metrics_.observe_request_latency(seconds_between(job.queued, Clock::now()));
}

void Scheduler::deliver(const std::vector<generate::StepEvent>& events) {
  const std::lock_guard lock(mutex_);
  const Clock::time_point now = Clock::now();
  for (const generate::StepEvent& event : events) {
    const auto found = running_.find(event.id);
    if (found == running_.end()) continue;  // cancelled during the step
    Slot& slot = found->second;
    Job& job = *slot.job;
    bool done = event.finished;
    {
      const std::lock_guard job_lock(job.mutex);
      ChoiceResult& choice = job.choices[slot.choice];
      choice.prompt_scores.insert(choice.prompt_scores.end(), event.prompt.begin(),
                                  event.prompt.end());
      if (event.drawn) {
        if (choice.tokens.empty()) {
          metrics_.observe_time_to_first_token(seconds_between(job.queued, now));
        } else {
          metrics_.observe_inter_token_latency(seconds_between(slot.last_token, now));
        }
        slot.last_token = now;
        metrics_.add_generated_tokens(1);
        // An end-of-sequence token ends the choice without being part of it.
        const std::vector<std::int64_t>& ends = job.params.tokenizer->roles().end_ids;
        const bool at_end = std::find(ends.begin(), ends.end(), event.drawn->token) != ends.end();
        if (!at_end) choice.tokens.push_back(*event.drawn);
        const std::optional<StopCut> cut =
            at_end ? std::nullopt : stop_cut(choice.tokens, job.params.stop, *job.params.tokenizer);
        if (at_end) {
          finish_choice(slot, "stop");
          done = true;
        } else if (cut) {
          choice.tokens.resize(cut->tokens);
          choice.text_bytes = cut->text_bytes;
          finish_choice(slot, "stop");
          if (!done) to_remove_.push_back(event.id);
          done = true;
        } else if (done) {
          finish_choice(slot, "length");
        }
      }
      ++job.version;
    }
    job.notify();
    if (done) running_.erase(found);
  }
  publish_load();
}

void Scheduler::reloaded(const ReloadResult& result) {
  std::vector<std::promise<ReloadResult>> waiters;
  {
    const std::lock_guard lock(mutex_);
    if (result.ok) weights_step_ = result.step;
    reload_wanted_ = false;
    waiters = std::exchange(reload_waiters_, {});
  }
  metrics_.count_reload(result.ok);
  if (result.ok) metrics_.set_weights_step(result.step);
  for (auto& waiter : waiters)
    waiter.set_value(result);
  work_.notify_all();
}

void Scheduler::set_weights_step(std::int64_t step) {
  {
    const std::lock_guard lock(mutex_);
    weights_step_ = step;
  }
  metrics_.set_weights_step(step);
}

std::int64_t Scheduler::weights_step() const {
  const std::lock_guard lock(mutex_);
  return weights_step_;
}

void Scheduler::fail_all(const std::string& message) {
  std::vector<std::promise<ReloadResult>> waiters;
  {
    const std::lock_guard lock(mutex_);
    const auto fail = [&](Slot& slot) {
      {
        const std::lock_guard job_lock(slot.job->mutex);
        slot.job->error = message;
        ++slot.job->version;
      }
      slot.job->notify();
    };
    for (Slot& slot : waiting_)
      fail(slot);
    for (auto& [id, slot] : running_)
      fail(slot);
    waiting_.clear();
    running_.clear();
    publish_load();
    draining_ = true;
    waiters = std::exchange(reload_waiters_, {});
    reload_wanted_ = false;
  }
  for (auto& waiter : waiters)
    waiter.set_value({false, 0, "", message});
}

}  // namespace meshtensor::serve
