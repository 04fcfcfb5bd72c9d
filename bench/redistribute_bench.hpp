#pragma once

#include <memory>

#include <meshtensor/comm/communicator.hpp>
#include <meshtensor/plan/planner.hpp>

namespace meshtensor::bench {

/// What `meshtensor bench redistribute` times.
struct RedistributeBenchConfig : plan::Redistribution {
  comm::ReductionMode mode = comm::ReductionMode::ordered;
  int iterations = 5;  ///< timed runs of each plan
};

/// Timings of the merged plan against the unmerged one (at most one mesh dim per collective, as
/// DTensor), the same on every rank.
struct RedistributeBenchResult {
  double merged_s = 0;    ///< median time of the merged plan (topology-blind with a topology)
  double unmerged_s = 0;  ///< median time of the unmerged plan (topology-blind)
  double ratio = 0;       ///< merged_s / unmerged_s
  int merged_collectives = 0;
  int unmerged_collectives = 0;
  /// With a topology (the world's has several hosts or domains): the topology-aware plan.
  bool topology = false;
  double aware_s = 0;             ///< median time of the topology-aware plan
  int aware_collectives = 0;      ///< its collectives (a two-level one counts once)
  int aware_two_level_steps = 0;  ///< its collectives that run in two levels
  double blind_over_aware = 0;    ///< merged_s / aware_s: the speed-up over the blind plan
  double one_dim_over_aware = 0;  ///< unmerged_s / aware_s: over DTensor's plan
  /// With a topology: the cost model's local figures measured on this machine before timing
  /// (every plan is made with them).
  double collective_s = 0;
  double memory_bandwidth_bytes_s = 0;
  bool aware_differs = false;  ///< the aware plan is not the blind one (else: one plan, twice)
};

/// Runs the plans alternately on `world` (with a topology: the aware one too) (which spans the
/// mesh; collective), each from the same source block after a barrier; a run's time is the slowest
/// rank's. Groups are created in a warm-up run first.
RedistributeBenchResult time_redistribute(const std::shared_ptr<comm::Communicator>& world,
                                          const RedistributeBenchConfig& config);

/// Bytes one rank holds at most while time_redistribute runs `config`: its source block, the
/// results and the working buffers of both plans.
double redistribute_bench_bytes_per_rank(const RedistributeBenchConfig& config);

/// Planning time per call.
struct PlanningTime {
  double uncached_s = 0;  ///< make_plan
  double cached_s = 0;    ///< PlanCache::get of a plan already made
  int collectives = 0;    ///< of the merged plan
};

/// Times planning `from` -> `to` on `mesh` (median over at least `iterations` calls and 0.2 s).
PlanningTime time_planning(const DeviceMesh& mesh, const PlacementSpec& from,
                           const PlacementSpec& to, const Shape& shape, DType dtype,
                           int iterations);

}  // namespace meshtensor::bench
