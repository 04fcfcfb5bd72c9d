#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <meshtensor/comm/communicator.hpp>
#include <meshtensor/core/dtype.hpp>
#include <meshtensor/core/shape.hpp>
#include <meshtensor/core/tensor.hpp>
#include <meshtensor/mesh/device_mesh.hpp>
#include <meshtensor/mesh/layout.hpp>
#include <meshtensor/mesh/spec.hpp>
#include <meshtensor/plan/plan.hpp>

namespace meshtensor::dtensor {

/// A redistribute to run on generated data and verify (`meshtensor check`).
struct CheckConfig : plan::Redistribution {
  comm::ReductionMode mode = comm::ReductionMode::ordered;
  std::uint64_t seed = 0;
  bool merge = true;
};

/// What a check found (the same on every rank).
struct CheckResult {
  bool ok = false;
  std::string digest;   ///< 16 hex digits of the assembled result
  std::string message;  ///< the first mismatch, or a summary when ok
  int collectives = 0;  ///< communicating steps of the plan that ran
  int two_level = 0;    ///< of them, those that ran in two levels (inside hosts, then across)
};

/// Number of Partial contributions a spec on `mesh` holds: the product of its Partial dims.
std::int64_t contribution_count(const DeviceMesh& mesh, const PlacementSpec& spec);

/// Fills `block` (laid out by `layout` in a tensor of `shape`) with contribution `index` of stream
/// `seed`: each element depends only on (seed, index, its global position), so the same
/// contributions exist on any mesh with the same number of them. Floating values spread over
/// several binades with both signs; integers stay small enough that sums do not overflow.
void fill_contribution(Tensor& block, const Layout& layout, const Shape& shape, std::uint64_t seed,
                       std::int64_t index);

/// Bytes that `ranks` ranks of run_check of `config` with `plan` hold at most together (all of
/// them on the threads backend, the ranks of one machine on mpi): their blocks before and after,
/// the plan's working buffers, and the reference of each block that one of them verifies.
double check_bytes(const CheckConfig& config, const plan::Plan& plan, std::int64_t ranks);

/// Runs the redistribute on `world` (which must span the mesh) and verifies every rank's block:
/// results without arithmetic, max/min, integer sums and `exact` sums bit for bit against a
/// reference; `ordered`/`native` floating sums within the rounding bound of their length.
/// Replicas must agree bit for bit in every mode. Each rank checks its own block against a
/// reference built from that block's contributions alone, so memory follows what the ranks hold.
/// Collective; the result is the same on all ranks. The digest is a checksum of the assembled
/// global result (one tensor per position of the target's source-kept Partial dims): a sum of a
/// hash of every element's position and bits, so it does not depend on the mesh.
CheckResult run_check(const std::shared_ptr<comm::Communicator>& world, const CheckConfig& config);

}  // namespace meshtensor::dtensor
