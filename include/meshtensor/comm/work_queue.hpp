#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include <meshtensor/comm/work.hpp>

namespace meshtensor::comm {

/// A FIFO of tasks run one at a time, in submission order, on the queue's own thread: the CPU
/// analogue of a stream. Each communication group owns one, so work on one group never waits
/// behind work on another.
class WorkQueue {
 public:
  WorkQueue() = default;
  WorkQueue(const WorkQueue&) = delete;
  WorkQueue& operator=(const WorkQueue&) = delete;
  /// Runs what is still queued, then stops the thread.
  ~WorkQueue();

  /// Runs what is still queued and joins the thread; later submits are refused. Owners whose
  /// tasks use other members call this first in their destructor. Idempotent.
  void stop();

  /// Queues `task`; the returned Work completes when it ran, carrying any exception it threw.
  Work submit(std::function<void()> task);

  /// Runs `task` in FIFO order and returns when it ran, rethrowing what it threw. When nothing is
  /// queued or running, it runs on the calling thread: a blocking call needs no hand-off to the
  /// queue's thread and back (two context switches), and a rank that only makes blocking calls
  /// never starts that thread.
  void run(const std::function<void()>& task);

 private:
  void serve();

  std::mutex mutex_;
  std::condition_variable ready_cv_;
  std::deque<std::pair<std::function<void()>, std::shared_ptr<WorkState>>> tasks_;
  bool stopping_ = false;
  bool busy_ = false;   // a task is running (on the queue's thread or inline)
  std::thread thread_;  // started by the first submit()
};

}  // namespace meshtensor::comm
