#include <algorithm>
#include <map>

#include <fmt/format.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/pp/schedule.hpp>

namespace meshtensor::pp {

ScheduleKind parse_schedule(const std::string& text) {
  if (text == "gpipe") return ScheduleKind::gpipe;
  if (text == "1f1b") return ScheduleKind::one_f_one_b;
  if (text == "interleaved-1f1b") return ScheduleKind::interleaved_1f1b;
  throw ParseError(fmt::format(
      "unknown pipeline schedule '{}' (expected gpipe, 1f1b or interleaved-1f1b)", text));
}

std::string schedule_name(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::gpipe:
      return "gpipe";
    case ScheduleKind::one_f_one_b:
      return "1f1b";
    case ScheduleKind::interleaved_1f1b:
      return "interleaved-1f1b";
  }
  return "?";
}

void check_schedule(const ScheduleConfig& config) {
  if (config.ranks < 1 || config.micro_batches < 1 || config.virtual_stages < 1) {
    throw InvalidArgument(fmt::format(
        "a pipeline needs at least 1 rank, micro-batch and virtual stage, got {}, {} and {}",
        config.ranks, config.micro_batches, config.virtual_stages));
  }
  const std::string name = schedule_name(config.kind);
  if (config.kind != ScheduleKind::interleaved_1f1b && config.virtual_stages != 1) {
    throw InvalidArgument(fmt::format(
        "{} runs one stage per rank, got {} virtual stages (interleaved-1f1b runs several)", name,
        config.virtual_stages));
  }
  if (config.kind == ScheduleKind::interleaved_1f1b) {
    if (config.virtual_stages < 2) {
      throw InvalidArgument(
          fmt::format("interleaved-1f1b needs at least 2 virtual stages per rank, got {}",
                      config.virtual_stages));
    }
    if (config.micro_batches % config.ranks != 0) {
      throw InvalidArgument(
          fmt::format("interleaved-1f1b takes micro-batches in rounds of one per pipeline rank: {} "
                      "micro-batches is not a multiple of the {} pp ranks",
                      config.micro_batches, config.ranks));
    }
  }
}

std::string PipelineAction::to_string() const {
  const char letter = kind == Kind::forward ? 'F' : 'B';
  return chunk == 0 ? fmt::format("{}{}", letter, micro_batch)
                    : fmt::format("{}{}.{}", letter, micro_batch, chunk);
}

namespace {

using Kind = PipelineAction::Kind;

std::vector<PipelineAction> one_rank_1f1b(std::int64_t rank, std::int64_t ranks,
                                          std::int64_t micro_batches, bool all_forward_first) {
  const std::int64_t warmup =
      all_forward_first ? micro_batches : std::min(ranks - rank - 1, micro_batches);
  std::vector<PipelineAction> actions;
  for (std::int64_t i = 0; i < warmup; ++i)
    actions.push_back({Kind::forward, 0, i});
  for (std::int64_t i = 0; i < micro_batches - warmup; ++i) {
    actions.push_back({Kind::forward, 0, warmup + i});
    actions.push_back({Kind::backward, 0, i});
  }
  for (std::int64_t i = micro_batches - warmup; i < micro_batches; ++i)
    actions.push_back({Kind::backward, 0, i});
  return actions;
}

/// Megatron's interleaved order: rounds of one micro-batch per rank through chunk 0, then the
/// same micro-batches through chunk 1, ...; backwards take the chunks in reverse.
std::vector<PipelineAction> one_rank_interleaved(std::int64_t rank, const ScheduleConfig& config) {
  const std::int64_t p = config.ranks;
  const std::int64_t v = config.virtual_stages;
  const std::int64_t total = v * config.micro_batches;
  const auto micro_batch = [&](std::int64_t k) { return (k / (p * v)) * p + k % p; };
  const auto forward = [&](std::int64_t k) {
    return PipelineAction{Kind::forward, (k / p) % v, micro_batch(k)};
  };
  const auto backward = [&](std::int64_t k) {
    return PipelineAction{Kind::backward, v - 1 - (k / p) % v, micro_batch(k)};
  };
  const std::int64_t warmup = std::min((p - rank - 1) * 2 + (v - 1) * p, total);
  std::vector<PipelineAction> actions;
  for (std::int64_t k = 0; k < warmup; ++k)
    actions.push_back(forward(k));
  for (std::int64_t i = 0; i < total - warmup; ++i) {
    actions.push_back(forward(warmup + i));
    actions.push_back(backward(i));
  }
  for (std::int64_t k = total - warmup; k < total; ++k)
    actions.push_back(backward(k));
  return actions;
}

}  // namespace

std::vector<std::vector<PipelineAction>> build_schedule(const ScheduleConfig& config) {
  check_schedule(config);
  std::vector<std::vector<PipelineAction>> schedule;
  for (std::int64_t r = 0; r < config.ranks; ++r) {
    switch (config.kind) {
      case ScheduleKind::gpipe:
        schedule.push_back(one_rank_1f1b(r, config.ranks, config.micro_batches, true));
        break;
      case ScheduleKind::one_f_one_b:
        schedule.push_back(one_rank_1f1b(r, config.ranks, config.micro_batches, false));
        break;
      case ScheduleKind::interleaved_1f1b:
        schedule.push_back(one_rank_interleaved(r, config));
        break;
    }
  }
  return schedule;
}

double theoretical_bubble(const ScheduleConfig& config) {
  const auto p = static_cast<double>(config.ranks);
  const auto m = static_cast<double>(config.micro_batches);
  const auto v = static_cast<double>(config.virtual_stages);
  return (p - 1) / (v * m + p - 1);
}

ScheduleReplay replay_schedule(const ScheduleConfig& config,
                               const std::vector<std::vector<PipelineAction>>& schedule,
                               double forward_seconds, double backward_seconds) {
  const std::int64_t p = config.ranks;
  const std::int64_t stages = config.stages();
  // When each (kind, stage, micro-batch) finished.
  std::map<std::tuple<int, std::int64_t, std::int64_t>, double> done;
  std::vector<std::size_t> next(static_cast<std::size_t>(p), 0);
  std::vector<double> free_at(static_cast<std::size_t>(p), 0.0);
  std::vector<double> busy(static_cast<std::size_t>(p), 0.0);
  std::vector<std::int64_t> in_flight(static_cast<std::size_t>(p), 0);
  ScheduleReplay replay;
  for (bool progress = true; progress;) {
    progress = false;
    for (std::int64_t r = 0; r < p; ++r) {
      const auto at = static_cast<std::size_t>(r);
      while (next[at] < schedule[at].size()) {
        const PipelineAction& a = schedule[at][next[at]];
        const std::int64_t stage = stage_of(config, r, a.chunk);
        const bool forward = a.kind == Kind::forward;
        double ready = free_at[at];
        if (forward && stage > 0) {
          const auto dep = done.find({0, stage - 1, a.micro_batch});
          if (dep == done.end()) break;
          ready = std::max(ready, dep->second);
        } else if (!forward) {
          const auto dep = stage + 1 < stages ? done.find({1, stage + 1, a.micro_batch})
                                              : done.find({0, stage, a.micro_batch});
          if (dep == done.end()) break;
          ready = std::max(ready, dep->second);
        }
        const double length = forward ? forward_seconds : backward_seconds;
        free_at[at] = ready + length;
        busy[at] += length;
        done[{forward ? 0 : 1, stage, a.micro_batch}] = free_at[at];
        in_flight[at] += forward ? 1 : -1;
        replay.peak_in_flight = std::max(replay.peak_in_flight, in_flight[at]);
        ++next[at];
        progress = true;
      }
    }
  }
  for (std::int64_t r = 0; r < p; ++r) {
    const auto at = static_cast<std::size_t>(r);
    if (next[at] < schedule[at].size()) {
      throw InvalidArgument(fmt::format("the {} schedule deadlocks: rank {} waits at {}",
                                        schedule_name(config.kind), r,
                                        schedule[at][next[at]].to_string()));
    }
    replay.makespan = std::max(replay.makespan, free_at[at]);
  }
  double idle = 0;
  for (std::int64_t r = 0; r < p; ++r)
    idle += 1.0 - busy[static_cast<std::size_t>(r)] / replay.makespan;
  replay.bubble = idle / static_cast<double>(p);
  return replay;
}

}  // namespace meshtensor::pp
