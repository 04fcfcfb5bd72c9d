#include <meshtensor/comm/work.hpp>
#include <meshtensor/comm/work_queue.hpp>

namespace meshtensor::comm {

void WorkState::finish(std::exception_ptr error) {
  {
    const std::lock_guard lock(mutex_);
    done_ = true;
    error_ = std::move(error);
  }
  done_cv_.notify_all();
}

void WorkState::wait() {
  std::unique_lock lock(mutex_);
  done_cv_.wait(lock, [this] { return done_; });
  if (error_) std::rethrow_exception(error_);
}

bool WorkState::completed() {
  const std::lock_guard lock(mutex_);
  return done_;
}

void Work::wait() const {
  if (state_) state_->wait();
}

bool Work::is_completed() const { return !state_ || state_->completed(); }

WorkQueue::~WorkQueue() {
  {
    const std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  ready_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

Work WorkQueue::submit(std::function<void()> task) {
  auto state = std::make_shared<WorkState>();
  {
    const std::lock_guard lock(mutex_);
    tasks_.emplace_back(std::move(task), state);
    if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
  }
  ready_cv_.notify_one();
  return Work(state);
}

void WorkQueue::run() {
  while (true) {
    std::pair<std::function<void()>, std::shared_ptr<WorkState>> next;
    {
      std::unique_lock lock(mutex_);
      ready_cv_.wait(lock, [this] { return stopping_ || !tasks_.empty(); });
      if (tasks_.empty()) return;  // stopping and drained
      next = std::move(tasks_.front());
      tasks_.pop_front();
    }
    try {
      next.first();
      next.second->finish(nullptr);
    } catch (...) {
      next.second->finish(std::current_exception());
    }
  }
}

}  // namespace meshtensor::comm
