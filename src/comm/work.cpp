#include <system_error>

#include <fmt/format.h>

#include <meshtensor/comm/work.hpp>
#include <meshtensor/comm/work_queue.hpp>
#include <meshtensor/core/error.hpp>

namespace meshtensor::comm {

namespace {
// Error classes a WorkState can report; anything else becomes a CommError with its message.
enum ErrorClass : int {
  kNone,
  kTimeout,
  kDesync,
  kComm,
  kParse,
  kInvalidArgument,
  kResource,
  kError,
  kOther
};

std::pair<int, std::string> classify(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const TimeoutError& e) {
    return {kTimeout, e.what()};
  } catch (const DesyncError& e) {
    return {kDesync, e.what()};
  } catch (const CommError& e) {
    return {kComm, e.what()};
  } catch (const ParseError& e) {
    return {kParse, e.what()};
  } catch (const InvalidArgument& e) {
    return {kInvalidArgument, e.what()};
  } catch (const ResourceError& e) {
    return {kResource, e.what()};
  } catch (const Error& e) {
    return {kError, e.what()};
  } catch (const std::exception& e) {
    return {kOther, e.what()};
  } catch (...) {
    return {kOther, "unknown non-standard exception"};
  }
}

[[noreturn]] void throw_recorded(int error_class, const std::string& message) {
  switch (error_class) {
    case kTimeout:
      throw TimeoutError(message);
    case kDesync:
      throw DesyncError(message);
    case kParse:
      throw ParseError(message);
    case kInvalidArgument:
      throw InvalidArgument(message);
    case kResource:
      throw ResourceError(message);
    case kError:
      throw Error(message);
    default:
      throw CommError(message);
  }
}
}  // namespace

void WorkState::finish(std::exception_ptr error) {
  std::pair<int, std::string> recorded{kNone, {}};
  if (error) recorded = classify(error);
  error = nullptr;  // the original exception object dies on this thread
  {
    const std::lock_guard lock(mutex_);
    done_ = true;
    error_class_ = recorded.first;
    error_message_ = std::move(recorded.second);
  }
  done_cv_.notify_all();
}

void WorkState::wait() {
  std::unique_lock lock(mutex_);
  done_cv_.wait(lock, [this] { return done_; });
  if (error_class_ != kNone) throw_recorded(error_class_, error_message_);
}

bool WorkState::completed() {
  const std::lock_guard lock(mutex_);
  return done_;
}

void Work::wait() const {
  if (state_) state_->wait();
}

bool Work::is_completed() const {
  return !state_ || state_->completed();
}

WorkQueue::~WorkQueue() {
  stop();
}

void WorkQueue::stop() {
  {
    const std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  ready_cv_.notify_all();
  if (!thread_.joinable()) return;
  if (thread_.get_id() == std::this_thread::get_id()) {
    thread_.detach();  // stopped from one of its own tasks: run() returns once drained
  } else {
    thread_.join();
  }
}

Work WorkQueue::submit(std::function<void()> task) {
  auto state = std::make_shared<WorkState>();
  {
    const std::lock_guard lock(mutex_);
    if (stopping_) throw CommError("work was submitted to a queue that has stopped");
    if (!thread_.joinable()) {
      try {
        thread_ = std::thread([this] { serve(); });
      } catch (const std::system_error& error) {
        throw CommError(
            fmt::format("cannot start a queue thread for asynchronous work: {}", error.what()));
      }
    }
    tasks_.emplace_back(std::move(task), state);
  }
  ready_cv_.notify_one();
  return Work(state);
}

void WorkQueue::run(const std::function<void()>& task) {
  {
    std::unique_lock lock(mutex_);
    if (stopping_) throw CommError("work was submitted to a queue that has stopped");
    if (!tasks_.empty() || busy_) {
      lock.unlock();
      submit(task).wait();
      return;
    }
    busy_ = true;
  }
  // Clears busy_ and lets the queue's thread go on with what was queued meanwhile.
  struct Release {
    WorkQueue& queue;
    ~Release() {
      {
        const std::lock_guard lock(queue.mutex_);
        queue.busy_ = false;
      }
      queue.ready_cv_.notify_one();
    }
  } release{*this};
  task();
}

void WorkQueue::serve() {
  while (true) {
    std::pair<std::function<void()>, std::shared_ptr<WorkState>> next;
    {
      std::unique_lock lock(mutex_);
      ready_cv_.wait(lock, [this] { return !busy_ && (stopping_ || !tasks_.empty()); });
      if (tasks_.empty()) return;  // stopping and drained
      next = std::move(tasks_.front());
      tasks_.pop_front();
      busy_ = true;
    }
    try {
      next.first();
      next.second->finish(nullptr);
    } catch (...) {
      next.second->finish(std::current_exception());
    }
    const std::lock_guard lock(mutex_);
    busy_ = false;
  }
}

}  // namespace meshtensor::comm
