#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include <meshtensor/comm/communicator.hpp>

namespace meshtensor::fsdp {

/// One span of time on one rank: a module's forward, an all-gather, an optimizer step.
struct TraceEvent {
  std::string name;           ///< e.g. "forward 0", "all_gather 2"
  std::string category;       ///< "compute", "unshard", "reduce", "optimizer", "wait"
  std::string lane;           ///< the thread it ran on: "compute", "unshard [0,1,2,3]", ...
  std::int64_t begin_us = 0;  ///< microseconds since the trace's start
  std::int64_t duration_us = 0;
};

/// Collects a rank's events when enabled (from any thread); costs a branch when not.
class Tracer {
 public:
  /// Starts recording; times count from `origin` (the same on every rank of a process).
  void enable(std::chrono::steady_clock::time_point origin);
  /// True when recording.
  bool enabled() const { return enabled_; }
  /// Records [begin, end) as `name` on `lane`.
  void record(std::string name, std::string category, std::string lane,
              std::chrono::steady_clock::time_point begin,
              std::chrono::steady_clock::time_point end);
  /// The events so far.
  std::vector<TraceEvent> events() const;

  /// Records the lifetime of a scope.
  class Span {
   public:
    Span(Tracer& tracer, std::string name, std::string category, std::string lane);
    Span(const Span&) = delete;
    Span& operator=(const Span&) = delete;
    ~Span();

   private:
    Tracer& tracer_;
    std::string name_;
    std::string category_;
    std::string lane_;
    std::chrono::steady_clock::time_point begin_;
  };

 private:
  bool enabled_ = false;
  std::chrono::steady_clock::time_point origin_;
  mutable std::mutex mutex_;
  std::vector<TraceEvent> events_;
};

/// The Chrome trace JSON (the format Perfetto and chrome://tracing open) of every rank's events:
/// collective over `world`, every rank passes its own; each rank is a process ("rank N") and each
/// lane a thread of it. Returns the document on world rank 0 and an empty string elsewhere.
std::string gather_chrome_trace(comm::Communicator& world, const std::vector<TraceEvent>& events);

}  // namespace meshtensor::fsdp
