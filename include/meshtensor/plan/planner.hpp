#pragma once

#include <cstddef>
#include <future>
#include <memory>
#include <mutex>
#include <unordered_map>

#include <meshtensor/plan/plan.hpp>

namespace meshtensor::plan {

/// Prices a step on one host: each collective costs a fixed start-up latency, a latency per round
/// (log2 of the group size) and its bytes over the network bandwidth; local copies cost their bytes
/// over the memory bandwidth. Only ratios matter.
struct CostModel {
  double collective_s = 50e-6;              ///< start-up and synchronisation of one collective
  double round_s = 5e-6;                    ///< per round of a collective (log2 of the group size)
  double bandwidth_bytes_s = 10e9;          ///< what one rank can send or receive
  double memory_bandwidth_bytes_s = 100e9;  ///< local copies
  double local_step_s = 1e-6;               ///< fixed cost of a local step
  double piece_s = 0.5e-6;                  ///< per piece a pack or unpack copies (its set-up)
};

/// What the planner may do.
struct PlanOptions {
  bool merge = true;  ///< collectives may span several mesh dims (flattened groups); off: at most
                      ///< one mesh dim per collective, as DTensor does
  CostModel cost;     ///< prices the candidates
  /// Where the ranks sit. With several hosts or domains each collective is priced on the links
  /// its groups cross (the topology's figures replace `cost.bandwidth_bytes_s`) and may run in
  /// two levels; on one host the plan is the same as without it.
  Topology topology;
  bool two_level = true;  ///< collectives may run in two levels (false: always flat)
  /// The plan's sums are ordered (ReductionMode::ordered, the default): a reducing step runs in
  /// two levels only when all its groups split over their units alike (unit_positions), since
  /// the two-level order follows the split and the copies that different groups hold of one
  /// tensor must be the same bits. Exact and native sums may split any way.
  bool order_sensitive = true;
  /// Exact sums: the bytes one value takes as fixed-point limbs in two levels (a one-byte key
  /// per value is agreed first); 0 for ordered and native sums, which carry the values.
  int fixed_point_bytes = 0;
};

/// Plans the redistribute of a tensor of `shape` and `dtype` from `from` to `to` on `mesh`: the
/// cheapest sequence of steps under the cost model among all that the planner can prove
/// correct. Pure: communicates nothing, and every rank gets the same plan. Throws
/// InvalidArgument naming the spec when a spec does not fit the mesh or the shape.
Plan make_plan(const DeviceMesh& mesh, const PlacementSpec& from, const PlacementSpec& to,
               const Shape& shape, DType dtype, const PlanOptions& options = {});

/// Plans made so far, by (mesh, specs, shape, dtype, merge). Thread-safe; plans are shared and
/// never change.
class PlanCache {
 public:
  /// The cached plan, made on the first request. Concurrent requests for a plan being made wait
  /// for it instead of making it again (every rank thread of a world asks for the same plan at
  /// once). A planning error reaches every waiter and is not cached.
  std::shared_ptr<const Plan> get(const DeviceMesh& mesh, const PlacementSpec& from,
                                  const PlacementSpec& to, const Shape& shape, DType dtype,
                                  const PlanOptions& options = {});
  /// Number of plans held.
  std::size_t size() const;
  /// Drops every plan.
  void clear();

 private:
  mutable std::mutex mutex_;
  std::unordered_map<std::string, std::shared_future<std::shared_ptr<const Plan>>> plans_;
};

/// The process-wide cache redistribute uses.
PlanCache& default_plan_cache();

}  // namespace meshtensor::plan
