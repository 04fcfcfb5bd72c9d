#pragma once

#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <string>

namespace meshtensor::comm {

/// Completion state shared by a Work handle and the queue that runs the work.
///
/// An error is recorded as its class in the meshtensor::Error hierarchy and its message, and each
/// wait() throws a fresh exception of that class on the waiting thread: exception objects never
/// cross threads, so their lifetime never depends on another thread's reference count.
class WorkState {
 public:
  /// Marks the work done; `error` (may be null) is what every wait() reports.
  void finish(std::exception_ptr error);
  /// Blocks until finish() ran; throws the recorded error.
  void wait();
  /// True once finish() ran.
  bool completed();

 private:
  std::mutex mutex_;
  std::condition_variable done_cv_;
  bool done_ = false;
  int error_class_ = 0;  // 0: none; see work.cpp
  std::string error_message_;
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
