#pragma once

#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>

namespace meshtensor::comm {

/// Completion state shared by a Work handle and the queue that runs the work.
class WorkState {
 public:
  /// Marks the work done; `error` (may be null) is rethrown by every wait().
  void finish(std::exception_ptr error);
  /// Blocks until finish() ran; rethrows its error.
  void wait();
  /// True once finish() ran.
  bool completed();

 private:
  std::mutex mutex_;
  std::condition_variable done_cv_;
  bool done_ = false;
  std::exception_ptr error_;
};

/// Handle to asynchronous work (a collective queued on its group). Copies share the state.
class Work {
 public:
  /// Already-completed work.
  Work() = default;
  /// Handle on `state`.
  explicit Work(std::shared_ptr<WorkState> state) : state_(std::move(state)) {}
  /// Blocks until the work finished; rethrows the error it failed with.
  void wait() const;
  /// True once the work finished (successfully or not); never blocks.
  bool is_completed() const;

 private:
  std::shared_ptr<WorkState> state_;
};

}  // namespace meshtensor::comm
