#include <algorithm>

#include <fmt/format.h>

#include <meshtensor/serve/metrics.hpp>

namespace meshtensor::serve {

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size(), 0) {}

void Histogram::observe(double value) {
  const auto at = std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin();
  if (at < static_cast<std::ptrdiff_t>(counts_.size())) ++counts_[static_cast<std::size_t>(at)];
  sum_ += value;
  ++count_;
}

std::string Histogram::text(const std::string& name) const {
  std::string out = fmt::format("# TYPE {} histogram\n", name);
  std::int64_t cumulative = 0;
  for (std::size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += counts_[i];
    out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, bounds_[i], cumulative);
  }
  out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n{}_sum {}\n{}_count {}\n", name, count_, name,
                     sum_, name, count_);
  return out;
}

namespace {
std::vector<double> latency_bounds() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
}
}  // namespace

Metrics::Metrics()
    : time_to_first_token_(latency_bounds()),
      inter_token_latency_(latency_bounds()),
      request_latency_(latency_bounds()) {}

void Metrics::count_request(const std::string& endpoint, int status) {
  const std::lock_guard lock(mutex_);
  ++requests_[{endpoint, status}];
}

void Metrics::add_prompt_tokens(std::int64_t count) {
  const std::lock_guard lock(mutex_);
  prompt_tokens_ += count;
}

void Metrics::add_generated_tokens(std::int64_t count) {
  const std::lock_guard lock(mutex_);
  generated_tokens_ += count;
}

void Metrics::observe_time_to_first_token(double seconds) {
  const std::lock_guard lock(mutex_);
  time_to_first_token_.observe(seconds);
}

void Metrics::observe_inter_token_latency(double seconds) {
  const std::lock_guard lock(mutex_);
  inter_token_latency_.observe(seconds);
}

void Metrics::observe_request_latency(double seconds) {
  const std::lock_guard lock(mutex_);
  request_latency_.observe(seconds);
}

void Metrics::set_load(std::int64_t waiting, std::int64_t running) {
  const std::lock_guard lock(mutex_);
  waiting_ = waiting;
  running_ = running;
}

void Metrics::set_weights_step(std::int64_t step) {
  const std::lock_guard lock(mutex_);
  weights_step_ = step;
}

void Metrics::count_reload(bool ok) {
  const std::lock_guard lock(mutex_);
  ++(ok ? reloads_ok_ : reloads_failed_);
}

std::string Metrics::prometheus_text() const {
  const std::lock_guard lock(mutex_);
  std::string out = "# TYPE meshtensor_requests_total counter\n";
  for (const auto& [key, count] : requests_)
    out += fmt::format("meshtensor_requests_total{{endpoint=\"{}\",status=\"{}\"}} {}\n", key.first,
                       key.second, count);
  out += fmt::format(
      "# TYPE meshtensor_prompt_tokens_total counter\nmeshtensor_prompt_tokens_total {}\n"
      "# TYPE meshtensor_generated_tokens_total counter\nmeshtensor_generated_tokens_total {}\n"
      "# TYPE meshtensor_queue_depth gauge\nmeshtensor_queue_depth {}\n"
      "# TYPE meshtensor_running_batch gauge\nmeshtensor_running_batch {}\n"
      "# TYPE meshtensor_weights_step gauge\nmeshtensor_weights_step {}\n"
      "# TYPE meshtensor_reloads_total counter\n"
      "meshtensor_reloads_total{{result=\"ok\"}} {}\nmeshtensor_reloads_total{{result=\"failed\"}} "
      "{}\n",
      prompt_tokens_, generated_tokens_, waiting_, running_, weights_step_, reloads_ok_,
      reloads_failed_);
  out += time_to_first_token_.text("meshtensor_time_to_first_token_seconds");
  out += inter_token_latency_.text("meshtensor_inter_token_latency_seconds");
  out += request_latency_.text("meshtensor_request_latency_seconds");
  return out;
}

}  // namespace meshtensor::serve
