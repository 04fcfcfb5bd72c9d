#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace meshtensor::pp {

/// The order in which each pipeline rank runs the forwards and backwards of its micro-batches.
enum class ScheduleKind : std::uint8_t {
  gpipe,        ///< every forward, then every backward (m micro-batches in flight)
  one_f_one_b,  ///< warm-up forwards, then one forward and one backward in turn (<= p in flight)
  interleaved_1f1b,  ///< 1F1B over v virtual stages per rank (a smaller bubble, more messages)
};

/// "gpipe", "1f1b" or "interleaved-1f1b"; ParseError naming the text otherwise.
ScheduleKind parse_schedule(const std::string& text);
/// The name parse_schedule reads.
std::string schedule_name(ScheduleKind kind);

/// A schedule's shape: `ranks` pipeline ranks (the pp mesh dim), `virtual_stages` model chunks
/// per rank (1 unless interleaved), `micro_batches` per step.
struct ScheduleConfig {
  ScheduleKind kind = ScheduleKind::one_f_one_b;
  std::int64_t ranks = 1;
  std::int64_t virtual_stages = 1;
  std::int64_t micro_batches = 1;
  /// Stages of the whole pipeline: ranks * virtual_stages.
  std::int64_t stages() const { return ranks * virtual_stages; }
};

/// Throws InvalidArgument naming the values a schedule cannot run with: no ranks or
/// micro-batches; virtual stages other than 1 outside interleaved-1f1b; interleaved-1f1b with
/// fewer than 2 virtual stages, or micro-batches that are not a multiple of the ranks (its
/// rounds take one micro-batch per rank).
void check_schedule(const ScheduleConfig& config);

/// One step of one rank: the forward or backward of one micro-batch through one of the rank's
/// chunks (chunk c of rank r is stage c * ranks + r).
struct PipelineAction {
  enum class Kind : std::uint8_t { forward, backward };
  Kind kind = Kind::forward;
  std::int64_t chunk = 0;
  std::int64_t micro_batch = 0;
  bool operator==(const PipelineAction&) const = default;
  /// "F3" or "B0.1" (micro-batch 0 of chunk 1).
  std::string to_string() const;
};

/// The stage chunk `chunk` of pipeline rank `rank` runs.
inline std::int64_t stage_of(const ScheduleConfig& config, std::int64_t rank, std::int64_t chunk) {
  return chunk * config.ranks + rank;
}

/// Every rank's actions in order (checked first). Each stage runs the forwards of micro-batches
/// 0..m-1 in order and their backwards in order, so the messages between two stages meet in
/// the same order at both ends.
std::vector<std::vector<PipelineAction>> build_schedule(const ScheduleConfig& config);

/// The idle fraction the schedule leaves each rank when every forward takes one unit and every
/// backward two, with free messages: (p-1)/(m+p-1) for GPipe and 1F1B, (p-1)/(v·m+p-1)
/// interleaved.
double theoretical_bubble(const ScheduleConfig& config);

/// Replays `schedule` with forwards of `forward_seconds` and backwards of `backward_seconds`
/// per stage, each rank in its order, each action waiting for the one it needs on the stage
/// before (forward) or after (backward): the makespan, the idle fraction of the busiest rank's
/// span and the most micro-batches in flight on any rank. InvalidArgument when the schedule
/// deadlocks (a rank waits for an action that can never run).
struct ScheduleReplay {
  double makespan = 0;
  double bubble = 0;  ///< 1 - busy / makespan, the mean over ranks
  std::int64_t peak_in_flight = 0;
};
ScheduleReplay replay_schedule(const ScheduleConfig& config,
                               const std::vector<std::vector<PipelineAction>>& schedule,
                               double forward_seconds = 1.0, double backward_seconds = 2.0);

}  // namespace meshtensor::pp
