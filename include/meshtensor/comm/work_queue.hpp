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

 private:
  void run();

  std::mutex mutex_;
  std::condition_variable ready_cv_;
  std::deque<std::pair<std::function<void()>, std::shared_ptr<WorkState>>> tasks_;
  bool stopping_ = false;
  std::thread thread_;  // started by the first submit()
};

}  // namespace meshtensor::comm
