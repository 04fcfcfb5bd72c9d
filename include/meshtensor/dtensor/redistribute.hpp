#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <meshtensor/comm/communicator.hpp>
#include <meshtensor/comm/mesh_groups.hpp>
#include <meshtensor/plan/planner.hpp>

namespace meshtensor::dtensor {

/// How a redistribute runs.
struct RedistributeOptions {
  /// Applies to every reducing step. `exact` keeps a chain of reducing steps in fixed point and
  /// rounds once, so the bits equal one flattened exact collective (and any mesh holding the
  /// same contributions).
  comm::ReductionMode mode = comm::ReductionMode::ordered;
  /// Collectives may span several mesh dims (false: at most one mesh dim each, as DTensor).
  bool merge = true;
  /// The runtime may create flattened groups (communicators over several mesh dims). When
  /// false, plans keep to one mesh dim per collective and a warning names each merge given up,
  /// once per (mesh, dims, reason).
  bool allow_flattened_groups = true;
  /// Timeout of each collective.
  std::chrono::milliseconds timeout = comm::default_timeout();
  /// Plans see where the ranks sit (the mesh groups' topology, DESIGN §3.10): collectives are
  /// priced on the links they cross and may run in two levels. False: planned as on one host,
  /// every collective flat (the topology-blind baseline).
  bool topology_aware = true;
  /// The planner's cost model (its defaults, or figures measured on the machine).
  plan::CostModel cost = {};
};

/// `options` with its plans priced on the topology of `groups` (when topology-aware), for sums
/// in its mode of `dtype` values.
plan::PlanOptions plan_options(const RedistributeOptions& options, const Topology& topology,
                               DType dtype);

/// The (cached) plan a redistribute with `options` runs.
std::shared_ptr<const plan::Plan> plan_for(const DeviceMesh& mesh, const PlacementSpec& from,
                                           const PlacementSpec& to, const Shape& shape, DType dtype,
                                           const RedistributeOptions& options = {});
/// The same, priced on `topology` (indexed by mesh rank).
std::shared_ptr<const plan::Plan> plan_for(const DeviceMesh& mesh, const PlacementSpec& from,
                                           const PlacementSpec& to, const Shape& shape, DType dtype,
                                           const RedistributeOptions& options,
                                           const Topology& topology);

/// The (cached) plan for a redistribute on the mesh of `groups`, priced on its topology.
std::shared_ptr<const plan::Plan> plan_for(const comm::MeshGroups& groups,
                                           const PlacementSpec& from, const PlacementSpec& to,
                                           const Shape& shape, DType dtype,
                                           const RedistributeOptions& options = {});

/// Runs `plan` on this rank: `local` is the block plan.from gives this rank (left untouched);
/// returns its block under plan.to. Collective over the mesh of `groups`: every rank runs the
/// same plan. Throws InvalidArgument when `local` has the wrong shape or dtype.
Tensor execute_plan(const plan::Plan& plan, comm::MeshGroups& groups, const Tensor& local,
                    const RedistributeOptions& options = {});

/// Runs several plans on this rank at once: `locals[i]` is the block plans[i].from gives this
/// rank; returns each block under its plan's `to`. Plans that only move data (no reducing step)
/// and share their collectives (kinds and mesh dims, in order) run each collective once for all
/// of them, every member's pieces back to back: n tensors cost the collectives of one. The
/// others run one by one. The same bits as execute_plan on each. Collective over the mesh of
/// `groups`: every rank runs the same plans in the same order. InvalidArgument as execute_plan.
std::vector<Tensor> execute_plans(std::span<const plan::Plan* const> plans,
                                  comm::MeshGroups& groups, std::span<const Tensor> locals,
                                  const RedistributeOptions& options = {});

/// The collectives execute_plans runs for `plans`.
std::int64_t batch_collectives(std::span<const plan::Plan* const> plans);

/// Where warnings go (default: one line on stderr, "meshtensor: warning: ..."). Thread-safe.
void set_warning_handler(std::function<void(const std::string&)> handler);

}  // namespace meshtensor::dtensor
