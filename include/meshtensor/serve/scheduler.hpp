#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <meshtensor/generate/continuous_batch.hpp>
#include <meshtensor/serve/api.hpp>
#include <meshtensor/serve/metrics.hpp>

namespace meshtensor::serve {

using Clock = std::chrono::steady_clock;

/// One HTTP request's work: its choices, filled in by the generation loop while the HTTP thread
/// that queued it waits on `changed` and writes them out.
struct Job {
  CompletionParams params;
  ResponseHeader header;  ///< weights_step is set (under `mutex`) when its first choice starts
  Clock::time_point queued = Clock::now();

  std::mutex mutex;
  std::condition_variable changed;
  // Guarded by `mutex`:
  std::vector<ChoiceResult> choices;
  std::size_t unfinished = 0;
  bool admitted = false;   ///< a choice started: header.weights_step is set
  bool cancelled = false;  ///< the client left
  bool started = false;    ///< a choice has been admitted (guarded by the scheduler)
  std::string error;       ///< set when the job failed after it was queued
  std::uint64_t version = 0;

  /// Called (without `mutex` held) after each change, beside `changed`: how a writer that does
  /// not block on `changed` hears of it. Set before the job is submitted, not after.
  std::function<void()> on_change;
  /// Wakes whoever waits for a change (after `version` was raised under `mutex`).
  void notify() {
    changed.notify_all();
    if (on_change) on_change();
  }
};

/// A request for the generation loop's ranks to start, with its id.
struct Admission {
  std::uint64_t id = 0;
  generate::Request request;
};

/// What every rank does before the next decode step; rank 0 decides it and the others follow.
struct StepPlan {
  std::vector<std::uint64_t> remove;
  std::vector<Admission> add;
  bool reload = false;  ///< load the served checkpoint again (nothing runs)
  bool exit = false;    ///< leave the loop (nothing runs)
};

/// The text a plan travels as between ranks, and back.
std::string encode_plan(const StepPlan& plan);
StepPlan decode_plan(const std::string& text);

/// What a reload did: the weights' step and directory, or the error that left the old ones.
struct ReloadResult {
  bool ok = false;
  std::int64_t step = 0;
  std::string directory;
  std::string error;
};

/// Limits of the queue and the batch.
struct SchedulerOptions {
  std::int64_t max_batch = 16;   ///< choices generated together
  std::int64_t max_queue = 256;  ///< choices waiting for a slot; more: 429
};

/// Between the HTTP threads and the generation loop (on world rank 0): a FIFO queue of choices,
/// admitted as slots free up; deliveries back to the jobs; cancellations, reloads and draining.
/// HTTP threads call submit/cancel/drain/reload; the loop calls next_plan/deliver/reloaded.
class Scheduler {
 public:
  Scheduler(SchedulerOptions options, Metrics& metrics);

  /// Queues every choice of `job` (its choices are set up here). ApiError 429 when the queue
  /// cannot take them now, 400 when it never could (more choices than max_queue), 503 while
  /// draining.
  void submit(const std::shared_ptr<Job>& job);
  /// The client of `job` left: its choices leave the queue and the batch.
  void cancel(const std::shared_ptr<Job>& job);
  /// Stops taking requests; the loop exits once every queued and running choice is done.
  void drain();
  bool draining() const;
  /// Asks the loop to load the served checkpoint again once the running choices are done
  /// (choices that have not started wait for the new weights).
  std::shared_future<ReloadResult> reload();

  /// The loop's next plan, given the batch's free slots; waits for work, at most `idle_wait`
  /// (then an empty plan) when nothing runs.
  StepPlan next_plan(std::int64_t running, std::int64_t free_slots,
                     std::chrono::milliseconds idle_wait);
  /// Hands a step's events to their jobs (stop sequences end a choice: it is removed in the
  /// next plan).
  void deliver(const std::vector<generate::StepEvent>& events);
  /// The loop finished a reload.
  void reloaded(const ReloadResult& result);
  /// The weights now served.
  void set_weights_step(std::int64_t step);
  std::int64_t weights_step() const;
  /// Fails every waiting job with `message` (the loop is gone).
  void fail_all(const std::string& message);

 private:
  struct Slot {
    std::shared_ptr<Job> job;
    std::size_t choice;
    Clock::time_point last_token;
  };
  void finish_choice(Slot& slot, const std::string& reason);
  /// The queue and batch sizes into the metrics (mutex_ held).
  void publish_load();
  bool start_allowed() const;

  SchedulerOptions options_;
  Metrics& metrics_;
  mutable std::mutex mutex_;
  std::condition_variable work_;
  std::deque<Slot> waiting_;
  std::map<std::uint64_t, Slot> running_;
  std::vector<std::uint64_t> to_remove_;
  std::uint64_t next_id_ = 1;
  bool draining_ = false;
  bool reload_wanted_ = false;
  std::int64_t weights_step_ = 0;
  std::vector<std::promise<ReloadResult>> reload_waiters_;
  std::shared_future<ReloadResult> reload_future_;
};

}  // namespace meshtensor::serve
