#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace meshtensor::serve {

/// A Prometheus histogram: counts per upper bound (cumulative when printed), sum and count.
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double value);
  /// Prometheus text lines of `name` (its _bucket, _sum and _count series).
  std::string text(const std::string& name) const;

 private:
  std::vector<double> bounds_;
  std::vector<std::int64_t> counts_;
  double sum_ = 0;
  std::int64_t count_ = 0;
};

/// The server's figures for GET /metrics, safe to update from any thread.
class Metrics {
 public:
  Metrics();
  /// A finished HTTP exchange of `endpoint` with `status`.
  void count_request(const std::string& endpoint, int status);
  void add_prompt_tokens(std::int64_t count);
  void add_generated_tokens(std::int64_t count);
  void observe_time_to_first_token(double seconds);
  void observe_inter_token_latency(double seconds);
  void observe_request_latency(double seconds);
  /// Choices waiting and running now.
  void set_load(std::int64_t waiting, std::int64_t running);
  void set_weights_step(std::int64_t step);
  void count_reload(bool ok);
  /// The Prometheus text exposition of everything above.
  std::string prometheus_text() const;

 private:
  mutable std::mutex mutex_;
  std::map<std::pair<std::string, int>, std::int64_t> requests_;
  std::int64_t prompt_tokens_ = 0;
  std::int64_t generated_tokens_ = 0;
  std::int64_t waiting_ = 0;
  std::int64_t running_ = 0;
  std::int64_t weights_step_ = 0;
  std::int64_t reloads_ok_ = 0;
  std::int64_t reloads_failed_ = 0;
  Histogram time_to_first_token_;
  Histogram inter_token_latency_;
  Histogram request_latency_;
};

}  // namespace meshtensor::serve
