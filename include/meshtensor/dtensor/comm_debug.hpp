#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include <meshtensor/dtensor/sharding.hpp>
#include <meshtensor/plan/plan.hpp>

namespace meshtensor::dtensor {

/// One collective this rank ran for an op.
struct CollectiveRecord {
  std::string kind;                    ///< all_reduce, reduce_scatter, all_gather, all_to_all
  std::vector<std::string> mesh_dims;  ///< the mesh dims of its group, major to minor
  std::int64_t group_size = 1;         ///< ranks in the group
  std::int64_t send_bytes = 0;         ///< bytes this rank sent
  std::string purpose;                 ///< "input 0 S0,R -> R,R", "vocabulary max", ...
};

/// One DTensor op (or a redistribute outside any op), as this rank ran it.
struct OpRecord {
  std::string op;                             ///< "matmul", "add", ..., or "redistribute"
  std::vector<std::string> given;             ///< the inputs' placements when the op was called
  OpStrategy strategy;                        ///< the strategy sharding propagation chose
  std::vector<CollectiveRecord> collectives;  ///< in the order they ran
  /// Some rank held the whole tensor between steps of a move although neither end asked for it.
  bool materializes_full_tensor = false;
};

/// Records, on the calling thread (one rank), every DTensor op and redistribute that runs while
/// it lives: the strategy chosen and the collectives each ran. Modes nest; records go to the
/// innermost one.
class CommDebugMode {
 public:
  /// Starts recording on this thread.
  CommDebugMode();
  /// Stops recording (the outer mode, if any, records again).
  ~CommDebugMode();
  CommDebugMode(const CommDebugMode&) = delete;
  CommDebugMode& operator=(const CommDebugMode&) = delete;

  /// The ops recorded, in call order.
  const std::vector<OpRecord>& ops() const { return ops_; }
  /// Number of collectives of `kind` (all kinds when empty).
  std::int64_t count(std::string_view kind = {}) const;
  /// Collectives per kind.
  std::map<std::string, std::int64_t> counts() const;
  /// One line per op (its placements, strategy and cost) and one per collective under it.
  std::string to_text() const;
  /// {"ops": [{"op", "given", "strategy", "collectives": [...]}], "counts": {...}}.
  nlohmann::json to_json() const;

  /// The innermost mode recording on this thread, or null.
  static CommDebugMode* active();

  /// Opens a record for `op` (collectives recorded until end_op() belong to it).
  void begin_op(OpRecord record);
  /// Closes the open record.
  void end_op();
  /// Adds the collectives of `plan`, run by mesh rank `rank` for `purpose`, to the open op (or
  /// to a new "redistribute" record when none is open).
  void add_plan(const plan::Plan& plan, std::int64_t rank, const std::string& purpose);
  /// Adds one collective to the open op (or to a new record of its own).
  void add_collective(CollectiveRecord record);
  /// True when some recorded move held a whole tensor neither of its ends asked for.
  bool materialized_full_tensor() const;

 private:
  OpRecord& current(const std::string& fallback_op);

  std::vector<OpRecord> ops_;
  bool open_ = false;
  CommDebugMode* outer_ = nullptr;
};

/// Keeps an op's record open on the active mode (if any) for the scope's life.
class OpScope {
 public:
  OpScope(const std::string& op, const std::vector<std::string>& given, const OpStrategy& strategy);
  ~OpScope();
  OpScope(const OpScope&) = delete;
  OpScope& operator=(const OpScope&) = delete;

 private:
  CommDebugMode* mode_;
};

}  // namespace meshtensor::dtensor
