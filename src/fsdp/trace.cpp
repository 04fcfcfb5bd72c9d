#include <nlohmann/json.hpp>

#include <meshtensor/fsdp/trace.hpp>

namespace meshtensor::fsdp {

void Tracer::enable(std::chrono::steady_clock::time_point origin) {
  origin_ = origin;
  enabled_ = true;
}

void Tracer::record(std::string name, std::string category, std::string lane,
                    std::chrono::steady_clock::time_point begin,
                    std::chrono::steady_clock::time_point end) {
  if (!enabled_) return;
  const auto micros = [this](std::chrono::steady_clock::time_point t) {
    return std::chrono::duration_cast<std::chrono::microseconds>(t - origin_).count();
  };
  const std::lock_guard lock(mutex_);
  events_.push_back(TraceEvent{std::move(name), std::move(category), std::move(lane), micros(begin),
                               micros(end) - micros(begin)});
}

std::vector<TraceEvent> Tracer::events() const {
  const std::lock_guard lock(mutex_);
  return events_;
}

Tracer::Span::Span(Tracer& tracer, std::string name, std::string category, std::string lane)
    : tracer_(tracer),
      name_(tracer.enabled() ? std::move(name) : std::string()),
      category_(std::move(category)),
      lane_(std::move(lane)),
      begin_(tracer.enabled() ? std::chrono::steady_clock::now()
                              : std::chrono::steady_clock::time_point()) {}

Tracer::Span::~Span() {
  if (tracer_.enabled()) {
    tracer_.record(std::move(name_), std::move(category_), std::move(lane_), begin_,
                   std::chrono::steady_clock::now());
  }
}

std::string gather_chrome_trace(comm::Communicator& world, const std::vector<TraceEvent>& events) {
  // Each rank's events travel as JSON text; rank 0 assembles the document.
  nlohmann::json mine = nlohmann::json::array();
  for (const TraceEvent& e : events)
    mine.push_back({e.name, e.category, e.lane, e.begin_us, e.duration_us});
  const std::string text = mine.dump();
  Tensor length = Tensor::full(Shape{1}, DType::i64, static_cast<double>(text.size()));
  Tensor lengths(Shape{world.size()}, DType::i64);
  world.all_gather(length, lengths);
  std::vector<std::int64_t> counts(lengths.values<std::int64_t>().begin(),
                                   lengths.values<std::int64_t>().end());
  std::int64_t total = 0;
  for (const std::int64_t c : counts)
    total += c;
  Tensor send(Shape{static_cast<std::int64_t>(text.size())}, DType::u8);
  std::copy(text.begin(), text.end(), reinterpret_cast<char*>(send.bytes().data()));
  Tensor all(Shape{total}, DType::u8);
  world.all_gather(send, all, counts);
  if (world.rank() != 0) return {};

  nlohmann::json trace_events = nlohmann::json::array();
  const auto* bytes = reinterpret_cast<const char*>(all.bytes().data());
  std::int64_t at = 0;
  for (int rank = 0; rank < world.size(); ++rank) {
    const auto n = counts[static_cast<std::size_t>(rank)];
    const nlohmann::json theirs = nlohmann::json::parse(bytes + at, bytes + at + n);
    at += n;
    trace_events.push_back({{"name", "process_name"},
                            {"ph", "M"},
                            {"pid", rank},
                            {"args", {{"name", "rank " + std::to_string(rank)}}}});
    trace_events.push_back({{"name", "process_sort_index"},
                            {"ph", "M"},
                            {"pid", rank},
                            {"args", {{"sort_index", rank}}}});
    std::vector<std::string> lanes;
    for (const auto& e : theirs) {
      const std::string lane = e[2].get<std::string>();
      auto found = std::find(lanes.begin(), lanes.end(), lane);
      if (found == lanes.end()) {
        lanes.push_back(lane);
        trace_events.push_back({{"name", "thread_name"},
                                {"ph", "M"},
                                {"pid", rank},
                                {"tid", lanes.size() - 1},
                                {"args", {{"name", lane}}}});
        found = lanes.end() - 1;
      }
      trace_events.push_back({{"name", e[0]},
                              {"cat", e[1]},
                              {"ph", "X"},
                              {"pid", rank},
                              {"tid", found - lanes.begin()},
                              {"ts", e[3]},
                              {"dur", e[4]}});
    }
  }
  return nlohmann::json{{"traceEvents", trace_events}, {"displayTimeUnit", "ms"}}.dump();
}

}  // namespace meshtensor::fsdp
