#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include <meshtensor/core/dtype.hpp>
#include <meshtensor/core/reduce_op.hpp>
#include <meshtensor/core/shape.hpp>
#include <meshtensor/mesh/device_mesh.hpp>
#include <meshtensor/mesh/spec.hpp>
#include <meshtensor/mesh/topology.hpp>

namespace meshtensor::plan {

/// What one step of a redistribute does.
enum class StepKind : std::uint8_t {
  all_reduce,      ///< Partial -> Replicate on the group's dims (layout unchanged)
  reduce_scatter,  ///< Partial -> Shard: each member keeps the reduced block it ends up owning
  all_gather,      ///< Shard -> Replicate: every member receives every member's block
  all_to_all,      ///< any other re-tiling of the group's data (Shard -> Shard, shard order, ...)
  local_chunk,     ///< Replicate -> Shard: keep one's own piece, no communication
  local_partial,   ///< Replicate/Shard -> Partial: one member keeps the value, the others zeros
  local_pack,      ///< copy the pieces for each member of the next collective into one buffer
  local_unpack,    ///< copy the pieces the collective delivered into the new local block
  scale,           ///< divide by the product of the reduced avg dims (once)
};

/// "all_reduce", "local_chunk", ...
std::string_view step_kind_name(StepKind kind);
/// True for the kinds that communicate.
bool is_collective(StepKind kind);

/// Per-rank traffic of a step, in bytes, indexed by mesh rank.
struct StepTraffic {
  std::vector<std::int64_t> send_bytes;  ///< bytes each rank sends to other ranks
  std::vector<std::int64_t> recv_bytes;  ///< bytes each rank receives from other ranks
  std::int64_t max_send_bytes = 0;       ///< the largest entry of send_bytes
  std::int64_t max_recv_bytes = 0;       ///< the largest entry of recv_bytes
  bool uneven = false;                   ///< members of one group move different amounts
};

/// One step: a transition of the whole tensor from spec `before` to spec `after` (they differ
/// only on the mesh dims of `group`, plus dims whose shard nesting the step rebuilds).
struct Step {
  StepKind kind = StepKind::all_reduce;
  std::vector<int> group;       ///< mesh dims, major to minor; the members of a rank's group are
                                ///< mesh.group_ranks(rank, group)
  ReduceOp op = ReduceOp::sum;  ///< reducing steps; sum also stands for avg (see `scale`)
  PlacementSpec before = PlacementSpec(std::vector<Placement>{});  ///< layout the step reads
  PlacementSpec after = PlacementSpec(std::vector<Placement>{});   ///< layout it leaves
  std::vector<int> keep_dims;   ///< local_partial: the member at position 0 along these keeps
  std::int64_t divisor = 1;     ///< scale only
  std::int64_t group_size = 1;  ///< ranks per group (1 for local steps)
  StepTraffic traffic;          ///< collectives only
  double cost_s = 0;            ///< cost-model estimate
  /// Collectives: the outermost level any of the step's groups crosses (domain on one host).
  LinkLevel level = LinkLevel::domain;
  /// Collectives: run in two levels (inside hosts or domains, then across them; see
  /// comm::TwoLevelCommunicator) because the cost model finds that cheaper than one flat
  /// collective on this topology.
  bool two_level = false;
  int units = 1;                 ///< hosts (or domains) the worst group spans
  int per_unit = 0;              ///< its members on each (0: jagged, some hold more than others)
  double flat_cost_s = 0;        ///< collectives: the flat form's estimate
  double two_level_cost_s = -1;  ///< collectives: the two-level form's estimate (-1: impossible)
  /// Ordered sums whose groups split over their units differently: two levels are ruled out.
  bool splits_differ = false;
};

/// What a redistribute is asked to do: move a tensor of `shape` and `dtype` on `mesh` from
/// spec `from` to spec `to`.
struct Redistribution {
  DeviceMesh mesh = DeviceMesh(std::vector<std::int64_t>{1});
  PlacementSpec from = PlacementSpec(std::vector<Placement>{});
  PlacementSpec to = PlacementSpec(std::vector<Placement>{});
  Shape shape;
  DType dtype = DType::f32;
};

/// A redistribute as plain data: what runs, on which groups, moving how many bytes. Made by
/// make_plan; never communicates.
struct Plan {
  DeviceMesh mesh = DeviceMesh(std::vector<std::int64_t>{1});
  PlacementSpec from = PlacementSpec(std::vector<Placement>{});
  PlacementSpec to = PlacementSpec(std::vector<Placement>{});
  Shape shape;
  DType dtype = DType::f32;
  bool merged = true;                     ///< whether collectives may span several mesh dims
  std::vector<Step> steps;                ///< in execution order
  std::vector<int> reduced_dims;          ///< source Partial dims the plan reduces, ascending
  std::int64_t avg_divisor = 1;           ///< product of the reduced Partial(avg) dims' sizes
  std::int64_t peak_bytes_per_rank = 0;   ///< largest block any rank holds between steps
  bool materializes_full_tensor = false;  ///< some rank holds the whole tensor between steps
                                          ///< although neither spec asks for it
  bool search_bounded = false;  ///< too many intermediate specs to search: the plan goes through
                                ///< Replicate, valid but perhaps not the cheapest
  double cost_s = 0;            ///< cost-model total
  Topology topology;            ///< where the ranks sit (priced per level when it has several)
  /// With a topology of several levels: the cost, on it, of the plan made without it (flat
  /// collectives, steps chosen on one level's figures), and whether that plan's steps differ.
  double blind_cost_s = -1;
  bool blind_differs = false;
  int blind_collectives = 0;  ///< collectives of that plan

  /// Number of communicating steps.
  int collectives() const;
  /// Total bytes all ranks send, over all steps.
  std::int64_t total_send_bytes() const;
};

/// A person-readable account of the plan: one line per step with its group, op and bytes.
std::string explain(const Plan& plan);

/// The same as data: {"mesh", "from", "to", "shape", "dtype", "merged", "collectives",
/// "steps": [{"kind", "group", "group_names", "group_size", "op", "before", "after",
/// "bytes_per_rank": {"send", "recv"}, "max_send_bytes", ...}], ...}.
nlohmann::json to_json(const Plan& plan);

}  // namespace meshtensor::plan
