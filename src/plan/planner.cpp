#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <queue>
#include <set>
#include <tuple>

#include <fmt/format.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/mesh/layout.hpp>
#include <meshtensor/plan/exchange.hpp>
#include <meshtensor/plan/planner.hpp>

// The planner searches the specs between source and target. A state is a spec; a move changes
// the placements of some mesh dims X at once and rebuilds the shard nesting of the tensor dims
// they touch. The move's group is X plus every mesh dim whose place in a nesting chain changes
// (a chunk's extent depends on the chunks outside it, so those dims' blocks change too). Moves
// are admitted only in forms whose correctness follows from the chain structure:
//   reduce:        Partial dims -> Replicate or Shard, group == X (new shards innermost);
//   make partial:  Replicate/Shard dims -> Partial, group == X;
//   data:          any non-Partial change; the group's blocks before and after tile the same
//                  region, so an all_to_all (all_gather, local chunk as special cases) moves it.
// Dijkstra over the cost model picks the cheapest path; merging several mesh dims into one
// collective is just a move whose X has several dims.

namespace meshtensor::plan {

namespace {
using Chains = std::vector<std::vector<int>>;

// Above this many candidate moves from one state the search considers a reduced set.
constexpr double kMaxMovesPerState = 4096;
// Above this many dims still to change, merged plans consider only class-wide moves.
constexpr std::size_t kMaxSearchDims = 6;
// States the search may settle; past it the planner takes the path through Replicate instead
// (every dim reduced or gathered, then chunked), which is valid but not always the cheapest, and
// says so in the plan.
constexpr std::size_t kMaxSettledStates = 2000;

struct State {
  std::vector<Placement> placements;
  Chains chains;  // per tensor dim: mesh dims sharding it, outermost first

  PlacementSpec spec() const {
    std::vector<int> levels(placements.size(), 0);
    for (const auto& chain : chains) {
      for (std::size_t level = 0; level < chain.size(); ++level)
        levels[static_cast<std::size_t>(chain[level])] = static_cast<int>(level);
    }
    return PlacementSpec(placements, levels);
  }

  std::string key() const {
    std::string out;
    for (const Placement& p : placements) {
      out += static_cast<char>(p.kind());
      out += static_cast<char>(p.is_shard() ? p.shard_dim() : 0);
      out += static_cast<char>(p.is_partial() ? static_cast<int>(p.reduce_op()) : 0);
    }
    for (const auto& chain : chains) {
      out += '|';
      for (int m : chain)
        out += static_cast<char>(m);
    }
    return out;
  }
};

State state_of(const DeviceMesh& mesh, const PlacementSpec& spec, int tensor_rank) {
  // Size-1 mesh dims hold the whole tensor whatever their placement: normalise them to
  // Replicate so that they never join a group or cost a step.
  State state;
  state.placements = spec.placements();
  for (int m = 0; m < mesh.ndim(); ++m) {
    if (mesh.size(m) == 1) state.placements[static_cast<std::size_t>(m)] = Placement::replicate();
  }
  state.chains.resize(static_cast<std::size_t>(tensor_rank));
  for (int t = 0; t < tensor_rank; ++t) {
    for (int m : spec.shard_mesh_dims(t)) {
      if (mesh.size(m) > 1) state.chains[static_cast<std::size_t>(t)].push_back(m);
    }
  }
  return state;
}

int position_in(const std::vector<int>& chain, int m) {
  const auto it = std::find(chain.begin(), chain.end(), m);
  return it == chain.end() ? -1 : static_cast<int>(it - chain.begin());
}

bool is_final(const State& state, const State& target, int m) {
  const Placement& now = state.placements[static_cast<std::size_t>(m)];
  if (!(now == target.placements[static_cast<std::size_t>(m)])) return false;
  if (!now.is_shard()) return true;
  const auto& chain = state.chains[static_cast<std::size_t>(now.shard_dim())];
  const auto& goal = target.chains[static_cast<std::size_t>(now.shard_dim())];
  const int pos = position_in(chain, m);
  if (pos < 0 || pos >= static_cast<int>(goal.size())) return false;
  return std::equal(chain.begin(), chain.begin() + pos + 1, goal.begin());
}

enum class MoveClass : std::uint8_t { reduce, make_partial, data };

struct Move {
  State after;
  Step step;  // kind, group, op, keep_dims; specs filled in when the path is built
  double cost = 0;
};

std::size_t common_prefix(const std::vector<int>& a, const std::vector<int>& b) {
  std::size_t n = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n])
    ++n;
  return n;
}

bool is_prefix(const std::vector<int>& prefix, const std::vector<int>& whole) {
  return prefix.size() <= whole.size() && std::equal(prefix.begin(), prefix.end(), whole.begin());
}

// Whether a spec may hold these Partial kinds together (sum with avg, or one kind).
bool combinable_partials(const std::vector<Placement>& placements) {
  bool extremum = false;
  bool seen[4] = {false, false, false, false};
  for (const Placement& p : placements) {
    if (!p.is_partial()) continue;
    seen[static_cast<int>(p.reduce_op())] = true;
    extremum = extremum || p.reduce_op() == ReduceOp::max || p.reduce_op() == ReduceOp::min;
  }
  return !extremum || seen[0] + seen[1] + seen[2] + seen[3] == 1;
}

class Planner {
 public:
  Planner(const DeviceMesh& mesh, const PlacementSpec& from, const PlacementSpec& to,
          const Shape& shape, DType dtype, const PlanOptions& options)
      : mesh_(mesh),
        shape_(shape),
        element_bytes_(static_cast<double>(dtype_size(dtype))),
        options_(options),
        source_(state_of(mesh, from, shape.rank())),
        target_(state_of(mesh, to, shape.rank())) {}

  const State& source() const { return source_; }
  const State& target() const { return target_; }

  // Cheapest path source -> target; every state on it and the move into it. Empty when the
  // search would settle more than kMaxSettledStates states.
  std::vector<Move> search() const {
    struct Entry {
      double cost;
      std::string key;
      bool operator>(const Entry& other) const {
        return cost != other.cost ? cost > other.cost : key > other.key;
      }
    };
    std::map<std::string, double> best;
    std::map<std::string, std::pair<std::string, Move>> came_from;
    std::map<std::string, State> states;
    std::priority_queue<Entry, std::vector<Entry>, std::greater<>> open;
    const std::string start = source_.key();
    const std::string goal = target_.key();
    best[start] = 0;
    states.emplace(start, source_);
    open.push({0, start});
    std::set<std::string> done;
    while (!open.empty()) {
      const Entry entry = open.top();
      open.pop();
      if (!done.insert(entry.key).second) continue;
      if (done.size() > kMaxSettledStates) return {};
      if (entry.key == goal) break;
      const State current = states.at(entry.key);
      for (Move& move : moves(current)) {
        const std::string next = move.after.key();
        const double cost = entry.cost + move.cost;
        auto found = best.find(next);
        if (found != best.end() && found->second <= cost) continue;
        best[next] = cost;
        states.insert_or_assign(next, move.after);
        came_from.insert_or_assign(next, std::make_pair(entry.key, std::move(move)));
        open.push({cost, next});
      }
    }
    if (!best.contains(goal)) {
      throw InvalidArgument("no redistribute path found");  // unreachable: all-at-once works
    }
    std::vector<Move> path;
    for (std::string key = goal; key != start;) {
      auto& [previous, move] = came_from.at(key);
      path.push_back(move);
      key = previous;
    }
    std::reverse(path.begin(), path.end());
    return path;
  }

  // The path through Replicate, one class of change at a time (each move's dims merged when
  // merging is on, one dim per move otherwise): Partial dims reduced to Replicate, shards that
  // are not final gathered innermost first, then the target's shards chunked outermost first and
  // its Partial dims made. Every move is one the search admits.
  std::vector<Move> path_through_replicate() const {
    std::vector<Move> path;
    State state = source_;
    const auto apply = [&](const std::vector<std::pair<int, Placement>>& changes) {
      if (changes.empty()) return;
      std::vector<std::vector<std::pair<int, Placement>>> moves;
      if (options_.merge) {
        moves.push_back(changes);
      } else {
        for (const auto& change : changes)
          moves.push_back({change});
      }
      for (const auto& move_changes : moves) {
        std::optional<Move> move = make_move(state, move_changes);
        if (!move) {
          throw InvalidArgument(fmt::format("no redistribute path found from {} to {} on mesh {}",
                                            source_.spec().to_string(), target_.spec().to_string(),
                                            mesh_.to_string()));
        }
        state = move->after;
        path.push_back(std::move(*move));
      }
    };
    std::vector<std::pair<int, Placement>> reduce;
    for (int m = 0; m < mesh_.ndim(); ++m) {
      if (state.placements[static_cast<std::size_t>(m)].is_partial() &&
          !is_final(state, target_, m))
        reduce.emplace_back(m, Placement::replicate());
    }
    apply(reduce);
    // Gathers, innermost first: one chain level at a time.
    while (true) {
      std::vector<std::pair<int, Placement>> gather;
      for (const auto& chain : state.chains) {
        if (!chain.empty() && !is_final(state, target_, chain.back()))
          gather.emplace_back(chain.back(), Placement::replicate());
      }
      if (gather.empty()) break;
      apply(gather);
    }
    // Chunks, outermost first: one target chain level at a time.
    for (std::size_t level = 0;; ++level) {
      std::vector<std::pair<int, Placement>> chunk;
      bool deeper = false;
      for (const auto& chain : target_.chains) {
        deeper = deeper || level < chain.size();
        if (level < chain.size() && !is_final(state, target_, chain[level])) {
          chunk.emplace_back(chain[level],
                             target_.placements[static_cast<std::size_t>(chain[level])]);
        }
      }
      if (!deeper) break;
      apply(chunk);
    }
    std::vector<std::pair<int, Placement>> partial;
    for (int m = 0; m < mesh_.ndim(); ++m) {
      if (!is_final(state, target_, m))
        partial.emplace_back(m, target_.placements[static_cast<std::size_t>(m)]);
    }
    apply(partial);
    if (state.key() != target_.key()) {
      throw InvalidArgument(fmt::format("no redistribute path found from {} to {} on mesh {}",
                                        source_.spec().to_string(), target_.spec().to_string(),
                                        mesh_.to_string()));
    }
    return path;
  }

  // Largest block any rank holds in `state`, per tensor dim (the first chunks are the largest).
  std::vector<std::int64_t> max_extents(const State& state) const {
    std::vector<std::int64_t> extents = shape_.dims();
    for (std::size_t t = 0; t < state.chains.size(); ++t) {
      for (int m : state.chains[t])
        extents[t] = chunk_extent(extents[t], mesh_.size(m), 0).size;
    }
    return extents;
  }

  double bytes_of(const State& state) const {
    double elements = 1;
    for (std::int64_t extent : max_extents(state))
      elements *= static_cast<double>(extent);
    return elements * element_bytes_;
  }

 private:
  // The placements a non-final dim may take next.
  std::vector<Placement> options_for(const Placement& now, const Placement& goal) const {
    std::vector<Placement> out;
    if (now.is_partial()) {
      out.push_back(Placement::replicate());
      if (goal.is_shard()) out.push_back(goal);
      return out;
    }
    if (!(goal.is_partial() && now.is_shard() && goal.reduce_op() != ReduceOp::sum)) {
      out.push_back(goal);
    }
    if (!now.is_replicate() && !goal.is_replicate()) out.push_back(Placement::replicate());
    return out;
  }

  std::vector<Move> moves(const State& state) const {
    std::vector<int> open_dims;
    for (int m = 0; m < mesh_.ndim(); ++m) {
      if (!is_final(state, target_, m)) open_dims.push_back(m);
    }
    std::vector<std::vector<Placement>> options;
    for (int m : open_dims) {
      options.push_back(options_for(state.placements[static_cast<std::size_t>(m)],
                                    target_.placements[static_cast<std::size_t>(m)]));
    }
    std::vector<Move> out;
    double combinations = 1;
    for (const auto& choices : options)
      combinations *= static_cast<double>(choices.size() + 1);
    if (combinations > kMaxMovesPerState || open_dims.size() > kMaxSearchDims) {
      // Many open dims: each class of change made on all dims at once, and (unmerged plans,
      // which need them) single-dim moves.
      for (std::size_t k = 0; k < open_dims.size() && !options_.merge; ++k) {
        for (const Placement& next : options[k]) {
          if (auto move = make_move(state, {{open_dims[k], next}})) out.push_back(std::move(*move));
        }
      }
      for (int wanted = 0; wanted < 3; ++wanted) {
        std::vector<std::pair<int, Placement>> changes;
        for (std::size_t k = 0; k < open_dims.size(); ++k) {
          const Placement& now = state.placements[static_cast<std::size_t>(open_dims[k])];
          const Placement& next = options[k][0];
          const int kind = now.is_partial() ? 0 : next.is_partial() ? 1 : 2;
          if (kind == wanted) changes.emplace_back(open_dims[k], next);
        }
        if (changes.size() > 1) {
          if (auto move = make_move(state, changes)) out.push_back(std::move(*move));
        }
      }
      return out;
    }
    // Enumerate every assignment (stay, or one of the options) of the open dims.
    std::vector<std::size_t> choice(open_dims.size(), 0);
    while (true) {
      std::size_t i = 0;
      while (i < choice.size() && ++choice[i] > options[i].size()) {
        choice[i] = 0;
        ++i;
      }
      if (i == choice.size()) break;
      std::vector<std::pair<int, Placement>> changes;
      for (std::size_t k = 0; k < choice.size(); ++k) {
        if (choice[k] > 0) changes.emplace_back(open_dims[k], options[k][choice[k] - 1]);
      }
      if (auto move = make_move(state, changes)) out.push_back(std::move(*move));
    }
    return out;
  }

  // Chain `t` after a move that changes the dims `changed`: the final prefix stays, then the
  // untouched open dims in their order, then the dims that join, in the target's order.
  std::vector<int> rebuilt_chain(const State& state, const State& after,
                                 const std::set<int>& changed, std::size_t t) const {
    const auto& chain = state.chains[t];
    std::vector<int> rebuilt;
    for (int m : chain) {
      if (is_final(state, target_, m)) rebuilt.push_back(m);
    }
    for (int m : chain) {
      if (!is_final(state, target_, m) && !changed.contains(m)) rebuilt.push_back(m);
    }
    for (int m : target_.chains[t]) {
      const Placement& next = after.placements[static_cast<std::size_t>(m)];
      if (changed.contains(m) && next.is_shard() && next.shard_dim() == static_cast<int>(t))
        rebuilt.push_back(m);
    }
    return rebuilt;
  }

  // A data move's kind: a local chunk when every chain only grows from Replicate, an all_gather
  // when every chain only shrinks to Replicate, an all_to_all otherwise.
  static StepKind data_step_kind(const State& state, const State& after,
                                 const std::vector<std::pair<int, Placement>>& changes) {
    bool chunk_only = true;
    bool gather_only = true;
    for (std::size_t t = 0; t < state.chains.size(); ++t) {
      chunk_only = chunk_only && is_prefix(state.chains[t], after.chains[t]);
      gather_only = gather_only && is_prefix(after.chains[t], state.chains[t]);
    }
    for (const auto& [m, next] : changes) {
      const Placement& now = state.placements[static_cast<std::size_t>(m)];
      chunk_only = chunk_only && now.is_replicate();
      gather_only = gather_only && next.is_replicate();
    }
    return chunk_only    ? StepKind::local_chunk
           : gather_only ? StepKind::all_gather
                         : StepKind::all_to_all;
  }

  std::optional<Move> make_move(const State& state,
                                const std::vector<std::pair<int, Placement>>& changes) const {
    // All changes must be of one class.
    auto class_of = [&](int m, const Placement& next) {
      const Placement& now = state.placements[static_cast<std::size_t>(m)];
      if (now.is_partial()) return MoveClass::reduce;
      if (next.is_partial()) return MoveClass::make_partial;
      return MoveClass::data;
    };
    const MoveClass move_class = class_of(changes[0].first, changes[0].second);
    for (const auto& [m, next] : changes) {
      if (class_of(m, next) != move_class) return std::nullopt;
    }

    Move move;
    move.after = state;
    std::set<int> changed;
    for (const auto& [m, next] : changes) {
      move.after.placements[static_cast<std::size_t>(m)] = next;
      changed.insert(m);
    }
    if (!combinable_partials(move.after.placements)) return std::nullopt;
    for (std::size_t t = 0; t < state.chains.size(); ++t)
      move.after.chains[t] = rebuilt_chain(state, move.after, changed, t);
    std::set<int> group = changed;
    for (std::size_t t = 0; t < state.chains.size(); ++t) {
      const auto& before = state.chains[t];
      const auto& after = move.after.chains[t];
      const std::size_t prefix = common_prefix(before, after);
      group.insert(before.begin() + static_cast<std::ptrdiff_t>(prefix), before.end());
      group.insert(after.begin() + static_cast<std::ptrdiff_t>(prefix), after.end());
    }
    if (move_class != MoveClass::data && group != changed) return std::nullopt;

    Step& step = move.step;
    std::int64_t group_size = 1;
    for (int m : group)
      group_size *= mesh_.size(m);
    if (move_class == MoveClass::reduce) {
      // All to Replicate (all_reduce) or all to Shard (reduce_scatter): a reduce_scatter cannot
      // hand two members the same block.
      const bool scatters = changes[0].second.is_shard();
      step.op = ReduceOp::sum;
      for (const auto& [m, next] : changes) {
        if (next.is_shard() != scatters) return std::nullopt;
        const ReduceOp op = state.placements[static_cast<std::size_t>(m)].reduce_op();
        if (op == ReduceOp::max || op == ReduceOp::min) step.op = op;
      }
      step.kind = scatters ? StepKind::reduce_scatter : StepKind::all_reduce;
      step.group = ordered_group(group, move.after);
    } else if (move_class == MoveClass::make_partial) {
      step.kind = StepKind::local_partial;
      step.group.assign(group.begin(), group.end());
      for (const auto& [m, next] : changes) {
        if (state.placements[static_cast<std::size_t>(m)].is_replicate() &&
            next.reduce_op() == ReduceOp::sum) {
          step.keep_dims.push_back(m);
        }
      }
    } else {
      step.kind = data_step_kind(state, move.after, changes);
      if (step.kind == StepKind::all_gather) {
        step.group = ordered_group(group, state);
      } else {
        step.group.assign(group.begin(), group.end());
      }
    }
    move.cost = price_move(state, move.after, step, options_.two_level);
    if (!options_.merge && is_collective(step.kind) && step.group.size() > 1) return std::nullopt;
    step.group_size = is_collective(step.kind) ? group_size : 1;
    return move;
  }

  // Prices `step` (kind and group set) from `before` to `after`; fills in the step's level and
  // its flat and two-level estimates, and picks two levels when allowed and cheaper. On one
  // host: one latency and one bandwidth for every collective.
  double price_move(const State& before, const State& after, Step& step,
                    bool allow_two_level) const {
    const CostModel& cost = options_.cost;
    const auto copy_s = [&](double bytes) { return bytes / cost.memory_bandwidth_bytes_s; };
    const double bytes_before = bytes_of(before);
    const double bytes_after = bytes_of(after);
    if (!is_collective(step.kind)) return cost.local_step_s + copy_s(bytes_after);
    std::int64_t group_size = 1;
    for (int m : step.group)
      group_size *= mesh_.size(m);
    const double n = static_cast<double>(group_size);
    const double rounds = std::ceil(std::log2(std::max(2.0, n)));
    const double spread = (n - 1) / n;
    const double latency = cost.collective_s + rounds * cost.round_s;
    const bool levels = !options_.topology.single_level();
    if (step.kind == StepKind::all_to_all) {
      LinkFigures link{0, cost.bandwidth_bytes_s};
      if (levels) {
        for (const GroupSpread& group : spreads(step.group))
          step.level = std::max(step.level, group.level);
        link = options_.topology.link(step.level);
      }
      step.flat_cost_s = latency + rounds * cost.round_s + link.latency_s +
                         spread * std::max(bytes_before, bytes_after) / link.bandwidth_bytes_s +
                         copy_s(bytes_before) + copy_s(bytes_after) +
                         std::min(n, exchange_pieces(before, after)) * cost.piece_s;
      return step.flat_cost_s;
    }
    RingKind ring = RingKind::all_reduce;
    double bytes = bytes_before;
    double flat_copy = 0;
    double per_collective = latency + rounds * cost.round_s;
    if (step.kind == StepKind::reduce_scatter) {
      ring = RingKind::reduce_scatter;
      per_collective = latency;
      if (needs_pack(before, after, step)) flat_copy = copy_s(bytes_before) + n * cost.piece_s;
    } else if (step.kind == StepKind::all_gather) {
      ring = RingKind::all_gather;
      bytes = bytes_after;
      per_collective = latency;
      if (needs_unpack(before, after, step)) flat_copy = copy_s(bytes_after) + n * cost.piece_s;
    }
    if (!levels) {
      const double factor = ring == RingKind::all_reduce ? 2.0 : 1.0;
      step.flat_cost_s =
          per_collective + factor * spread * bytes / cost.bandwidth_bytes_s + flat_copy;
      return step.flat_cost_s;
    }
    // Groups run at once: the step takes as long as its slowest group. In the two-level form a
    // group that cannot take it (on one unit, or one member per unit) runs flat.
    double flat = 0;
    double two = 0;
    bool possible = false;
    TwoLevelExtra extra;
    if (options_.fixed_point_bytes > 0 && ring != RingKind::all_gather) {
      extra.bytes_scale = options_.fixed_point_bytes / element_bytes_;
      extra.key_bytes = bytes / element_bytes_;
    }
    for (const GroupSpread& group : spreads(step.group)) {
      const TwoLevelPrice price =
          price_two_level(options_.topology, group, ring, bytes,
                          LocalCosts{per_collective, cost.memory_bandwidth_bytes_s}, flat_copy,
                          copy_s(bytes) + n * cost.piece_s, extra);
      if (price.flat_s >= flat) {
        step.units = group.units;
        step.per_unit = group.per_unit;
      }
      flat = std::max(flat, price.flat_s);
      two = std::max(two, price.possible ? price.two_level_s : price.flat_s);
      possible = possible || price.possible;
      step.level = std::max(step.level, group.level);
    }
    if (possible && options_.order_sensitive && ring != RingKind::all_gather &&
        !splits_alike(step.group)) {
      possible = false;
      step.splits_differ = true;
    }
    step.flat_cost_s = flat;
    step.two_level_cost_s = possible ? two : -1;
    step.two_level = allow_two_level && possible && two < flat;
    return step.two_level ? two : flat;
  }

  // True when every group over `dims` puts the same positions on each of its units.
  bool splits_alike(const std::vector<int>& dims) const {
    std::vector<int> key = dims;
    std::sort(key.begin(), key.end());
    if (auto found = alike_.find(key); found != alike_.end()) return found->second;
    std::vector<std::vector<int>> first;
    bool alike = true;
    for (std::int64_t r = 0; r < mesh_.size() && alike; ++r) {
      if (mesh_.group_position(r, dims) != 0) continue;
      std::vector<std::vector<int>> split =
          unit_positions(options_.topology, mesh_.group_ranks(r, dims));
      if (first.empty()) {
        first = std::move(split);
      } else {
        alike = split == first;
      }
    }
    return alike_.emplace(std::move(key), alike).first->second;
  }

  // How each group over `dims` (one per position outside them) sits on the topology; the
  // distinct spreads only, cached per dims.
  const std::vector<GroupSpread>& spreads(const std::vector<int>& dims) const {
    std::vector<int> key = dims;
    std::sort(key.begin(), key.end());
    auto found = spreads_.find(key);
    if (found != spreads_.end()) return found->second;
    std::vector<GroupSpread> out;
    std::set<std::tuple<int, std::int64_t, int, int, int, int, int>> seen;
    for (std::int64_t r = 0; r < mesh_.size(); ++r) {
      if (mesh_.group_position(r, dims) != 0) continue;
      const std::vector<std::int64_t> members = mesh_.group_ranks(r, dims);
      const GroupSpread group = spread_of(options_.topology, members);
      if (seen.emplace(static_cast<int>(group.level), group.members, group.units, group.per_unit,
                       group.fewest, group.most, static_cast<int>(group.inner))
              .second)
        out.push_back(group);
    }
    return spreads_.emplace(std::move(key), std::move(out)).first->second;
  }

  // About how many pieces one rank packs and unpacks in a data move from `before` to `after`:
  // along each tensor dim, a block splits into as many pieces as the finer chunking has chunks
  // per chunk of the coarser one.
  double exchange_pieces(const State& before, const State& after) const {
    double send = 1;
    double receive = 1;
    for (std::size_t t = 0; t < before.chains.size(); ++t) {
      double chunks_before = 1;
      double chunks_after = 1;
      for (int m : before.chains[t])
        chunks_before *= static_cast<double>(mesh_.size(m));
      for (int m : after.chains[t])
        chunks_after *= static_cast<double>(mesh_.size(m));
      send *= std::max(1.0, std::ceil(chunks_after / chunks_before));
      receive *= std::max(1.0, std::ceil(chunks_before / chunks_after));
    }
    return send + receive;
  }

  // Group order for reduce_scatter / all_gather: by tensor dim, then nesting level in `sharded`
  // (so that members' pieces follow one another in memory where the layout allows), then the
  // remaining dims ascending.
  std::vector<int> ordered_group(const std::set<int>& group, const State& sharded) const {
    std::vector<int> out;
    for (const auto& chain : sharded.chains) {
      for (int m : chain) {
        if (group.contains(m)) out.push_back(m);
      }
    }
    for (int m : group) {
      if (std::find(out.begin(), out.end(), m) == out.end()) out.push_back(m);
    }
    return out;
  }

  // Whether members' pieces of the big block (the block before a reduce_scatter, after an
  // all_gather) are consecutive in row-major order in group order: all the group's dims split
  // one tensor dim t, innermost, in group order, and no tensor dim before t has extent above 1.
  bool pieces_are_consecutive(const State& big, const State& small,
                              const std::vector<int>& group) const {
    int tensor_dim = -1;
    for (std::size_t t = 0; t < small.chains.size(); ++t) {
      if (small.chains[t] == big.chains[t]) continue;
      if (tensor_dim >= 0) return false;
      tensor_dim = static_cast<int>(t);
    }
    if (tensor_dim < 0) return true;
    const auto& chain = small.chains[static_cast<std::size_t>(tensor_dim)];
    const auto& outer = big.chains[static_cast<std::size_t>(tensor_dim)];
    if (!is_prefix(outer, chain) ||
        !std::equal(group.begin(), group.end(),
                    chain.begin() + static_cast<std::ptrdiff_t>(outer.size()), chain.end())) {
      return false;
    }
    const std::vector<std::int64_t> extents = max_extents(big);
    for (int t = 0; t < tensor_dim; ++t) {
      if (extents[static_cast<std::size_t>(t)] > 1) return false;
    }
    return true;
  }

 public:
  // The cost of `move` from `before` on this planner's topology, its collective kept flat.
  double price_flat(const State& before, const Move& move) const {
    Step step = move.step;
    return price_move(before, move.after, step, false);
  }
  bool needs_pack(const State& before, const State& after, const Step& step) const {
    return !pieces_are_consecutive(before, after, step.group);
  }
  bool needs_unpack(const State& before, const State& after, const Step& step) const {
    return !pieces_are_consecutive(after, before, step.group);
  }

 private:
  const DeviceMesh& mesh_;
  const Shape& shape_;
  double element_bytes_;
  PlanOptions options_;
  mutable std::map<std::vector<int>, std::vector<GroupSpread>> spreads_;
  mutable std::map<std::vector<int>, bool> alike_;
  State source_;
  State target_;
};

// Exact per-rank traffic of a collective step.
StepTraffic traffic_of(const DeviceMesh& mesh, const Step& step, const Shape& shape,
                       std::size_t element_bytes) {
  StepTraffic traffic;
  const auto ranks = static_cast<std::size_t>(mesh.size());
  traffic.send_bytes.assign(ranks, 0);
  traffic.recv_bytes.assign(ranks, 0);
  const auto bytes = [&](std::int64_t elements) {
    return elements * static_cast<std::int64_t>(element_bytes);
  };
  std::vector<std::int64_t> before(ranks), after(ranks);
  for (std::size_t r = 0; r < ranks; ++r) {
    before[r] = local_layout(mesh, step.before, shape, static_cast<std::int64_t>(r)).numel();
    after[r] = local_layout(mesh, step.after, shape, static_cast<std::int64_t>(r)).numel();
  }
  const std::int64_t n = step.group_size;
  for (std::size_t r = 0; r < ranks; ++r) {
    const auto rank = static_cast<std::int64_t>(r);
    switch (step.kind) {
      case StepKind::all_reduce: {
        // Each member reduces one segment and shares it: (n-1)/n of the buffer out, twice.
        const std::int64_t share = before[r] - before[r] / n;
        traffic.send_bytes[r] = traffic.recv_bytes[r] = bytes(2 * share);
        break;
      }
      case StepKind::reduce_scatter:
        traffic.send_bytes[r] = bytes(before[r] - after[r]);
        traffic.recv_bytes[r] = bytes((n - 1) * after[r]);
        break;
      case StepKind::all_gather:
        traffic.send_bytes[r] = bytes((n - 1) * before[r]);
        traffic.recv_bytes[r] = bytes(after[r] - before[r]);
        break;
      case StepKind::all_to_all: {
        const ExchangeVolume volume = exchange_volume(mesh, step, shape, rank);
        traffic.send_bytes[r] = bytes(volume.send);
        traffic.recv_bytes[r] = bytes(volume.recv);
        break;
      }
      default:
        break;
    }
    if (step.kind == StepKind::reduce_scatter && after[r] != after[0]) traffic.uneven = true;
    if (step.kind == StepKind::all_gather && before[r] != before[0]) traffic.uneven = true;
    if (step.kind == StepKind::all_to_all && (before[r] != before[0] || after[r] != after[0])) {
      traffic.uneven = true;
    }
  }
  traffic.max_send_bytes = *std::max_element(traffic.send_bytes.begin(), traffic.send_bytes.end());
  traffic.max_recv_bytes = *std::max_element(traffic.recv_bytes.begin(), traffic.recv_bytes.end());
  return traffic;
}

std::int64_t avg_divisor(const DeviceMesh& mesh, const PlacementSpec& from,
                         const std::vector<int>& reduced) {
  std::int64_t divisor = 1;
  for (int m : reduced) {
    if (from.at(m).reduce_op() == ReduceOp::avg) divisor *= mesh.size(m);
  }
  return divisor;
}

// The planner's cheapest path; the path through Replicate (and `bounded` set) when the search
// gives up.
std::vector<Move> cheapest_path(const Planner& planner, bool& bounded) {
  std::vector<Move> path = planner.search();
  bounded = false;
  if (path.empty() && planner.source().key() != planner.target().key()) {
    path = planner.path_through_replicate();
    bounded = true;
  }
  return path;
}
}  // namespace

namespace {

// The topology-blind plan's cost on the planner's links, its collectives, and whether `path`
// differs from it.
void compare_with_blind(Plan& plan, const Planner& planner, const std::vector<Move>& path,
                        const PlanOptions& options) {
  PlanOptions blind_options = options;
  blind_options.topology = Topology();
  const Planner blind(plan.mesh, plan.from, plan.to, plan.shape, plan.dtype, blind_options);
  bool blind_bounded = false;
  const std::vector<Move> blind_path = cheapest_path(blind, blind_bounded);
  State at = blind.source();
  plan.blind_cost_s = 0;
  plan.blind_differs = blind_path.size() != path.size();
  for (std::size_t i = 0; i < blind_path.size(); ++i) {
    const Move& move = blind_path[i];
    plan.blind_cost_s += planner.price_flat(at, move);
    if (is_collective(move.step.kind)) ++plan.blind_collectives;
    if (i < path.size() &&
        (path[i].after.key() != move.after.key() || path[i].step.kind != move.step.kind ||
         path[i].step.group != move.step.group || path[i].step.two_level)) {
      plan.blind_differs = true;
    }
    at = move.after;
  }
}

// The plan's steps for `path`, with the local packs and unpacks its collectives need; the
// index of the last reducing step (-1 for none).
int emit_steps(Plan& plan, const Planner& planner, const std::vector<Move>& path) {
  State state = planner.source();
  const double full_bytes = static_cast<double>(plan.shape.numel() * dtype_size(plan.dtype));
  const bool ends_full = planner.bytes_of(planner.source()) >= full_bytes ||
                         planner.bytes_of(planner.target()) >= full_bytes;
  plan.peak_bytes_per_rank = static_cast<std::int64_t>(planner.bytes_of(state));
  int last_reduce = -1;
  for (const Move& move : path) {
    Step step = move.step;
    step.before = state.spec();
    step.after = move.after.spec();
    step.cost_s = move.cost;
    const bool pack =
        (step.kind == StepKind::reduce_scatter && planner.needs_pack(state, move.after, step)) ||
        step.kind == StepKind::all_to_all;
    const bool unpack =
        (step.kind == StepKind::all_gather && planner.needs_unpack(state, move.after, step)) ||
        step.kind == StepKind::all_to_all;
    if (is_collective(step.kind))
      step.traffic = traffic_of(plan.mesh, step, plan.shape, dtype_size(plan.dtype));
    auto local_copy = [&](StepKind kind) {
      Step copy;
      copy.kind = kind;
      copy.group = step.group;
      copy.before = step.before;
      copy.after = step.after;
      return copy;
    };
    if (pack) plan.steps.push_back(local_copy(StepKind::local_pack));
    Step unpack_step = local_copy(StepKind::local_unpack);
    const bool reduces = step.kind == StepKind::all_reduce || step.kind == StepKind::reduce_scatter;
    if (reduces)
      plan.reduced_dims.insert(plan.reduced_dims.end(), step.group.begin(), step.group.end());
    plan.steps.push_back(std::move(step));
    if (reduces) last_reduce = static_cast<int>(plan.steps.size()) - 1;
    if (unpack) plan.steps.push_back(std::move(unpack_step));
    plan.cost_s += move.cost;
    state = move.after;
    const double held = planner.bytes_of(state);
    plan.peak_bytes_per_rank = std::max(plan.peak_bytes_per_rank, static_cast<std::int64_t>(held));
    if (&move != &path.back() && held >= full_bytes && !ends_full && plan.mesh.size() > 1)
      plan.materializes_full_tensor = true;
  }
  return last_reduce;
}

// avg dims divide once, right after the last reducing step (and its unpack).
void insert_avg_scale(Plan& plan, int last_reduce) {
  std::sort(plan.reduced_dims.begin(), plan.reduced_dims.end());
  plan.avg_divisor = avg_divisor(plan.mesh, plan.from, plan.reduced_dims);
  if (plan.avg_divisor <= 1) return;
  Step scale;
  scale.kind = StepKind::scale;
  scale.divisor = plan.avg_divisor;
  scale.before = scale.after = plan.steps[static_cast<std::size_t>(last_reduce)].after;
  if (plan.steps.size() > static_cast<std::size_t>(last_reduce) + 1 &&
      plan.steps[static_cast<std::size_t>(last_reduce) + 1].kind == StepKind::local_unpack) {
    ++last_reduce;
  }
  plan.steps.insert(plan.steps.begin() + last_reduce + 1, std::move(scale));
}

}  // namespace

Plan make_plan(const DeviceMesh& mesh, const PlacementSpec& from, const PlacementSpec& to,
               const Shape& shape, DType dtype, const PlanOptions& options) {
  from.validate(mesh, shape.rank());
  to.validate(mesh, shape.rank());
  Plan plan;
  plan.mesh = mesh;
  plan.from = from;
  plan.to = to;
  plan.shape = shape;
  plan.dtype = dtype;
  plan.merged = options.merge;
  plan.topology = options.topology;
  const bool levels = !options.topology.single_level();
  if (levels && options.topology.ranks() != mesh.size()) {
    throw InvalidArgument(fmt::format(
        "a topology of {} ranks ({} per host) for mesh {} of {} ranks", options.topology.ranks(),
        options.topology.host_sizes_text(), mesh.to_string(), mesh.size()));
  }
  const Planner planner(mesh, from, to, shape, dtype, options);
  bool bounded = false;
  const std::vector<Move> path = cheapest_path(planner, bounded);
  plan.search_bounded = bounded;
  if (levels) compare_with_blind(plan, planner, path, options);
  insert_avg_scale(plan, emit_steps(plan, planner, path));
  return plan;
}

std::shared_ptr<const Plan> PlanCache::get(const DeviceMesh& mesh, const PlacementSpec& from,
                                           const PlacementSpec& to, const Shape& shape, DType dtype,
                                           const PlanOptions& options) {
  std::string key;
  auto put = [&key](std::int64_t value) {
    key.append(reinterpret_cast<const char*>(&value), sizeof value);
  };
  for (std::int64_t size : mesh.sizes())
    put(size);
  put(-1);
  for (const std::string& name : mesh.names())
    key += name + ',';
  for (const PlacementSpec* spec : {&from, &to}) {
    for (int m = 0; m < spec->mesh_ndim(); ++m) {
      const Placement& p = spec->at(m);
      put((static_cast<std::int64_t>(p.kind()) << 40) |
          (static_cast<std::int64_t>(p.is_shard() ? p.shard_dim() : 0) << 16) |
          (static_cast<std::int64_t>(p.is_partial() ? static_cast<int>(p.reduce_op()) : 0) << 8) |
          spec->shard_levels()[static_cast<std::size_t>(m)]);
    }
    put(-2);
  }
  for (std::int64_t dim : shape.dims())
    put(dim);
  put(static_cast<std::int64_t>(dtype) * 2 + (options.merge ? 1 : 0));
  key += options.topology.key();
  const CostModel& cost = options.cost;
  key += fmt::format("|{:a},{:a},{:a},{:a},{:a},{:a}", cost.collective_s, cost.round_s,
                     cost.bandwidth_bytes_s, cost.memory_bandwidth_bytes_s, cost.local_step_s,
                     cost.piece_s);
  key += options.two_level ? "|2" : "|1";
  key += options.order_sensitive ? "o" : "x";
  key += std::to_string(options.fixed_point_bytes);
  std::promise<std::shared_ptr<const Plan>> made;
  std::shared_future<std::shared_ptr<const Plan>> pending;
  {
    const std::lock_guard lock(mutex_);
    if (auto found = plans_.find(key); found != plans_.end()) {
      pending = found->second;
    } else {
      plans_.emplace(key, made.get_future().share());
    }
  }
  if (pending.valid()) return pending.get();  // made, or being made by another thread
  try {
    auto plan = std::make_shared<const Plan>(make_plan(mesh, from, to, shape, dtype, options));
    made.set_value(plan);
    return plan;
  } catch (...) {
    made.set_exception(std::current_exception());
    const std::lock_guard lock(mutex_);
    plans_.erase(key);
    throw;
  }
}

std::size_t PlanCache::size() const {
  const std::lock_guard lock(mutex_);
  return plans_.size();
}

void PlanCache::clear() {
  const std::lock_guard lock(mutex_);
  plans_.clear();
}

PlanCache& default_plan_cache() {
  static PlanCache cache;
  return cache;
}

}  // namespace meshtensor::plan
