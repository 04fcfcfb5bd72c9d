#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <meshtensor/comm/chain.hpp>
#include <meshtensor/core/error.hpp>
#include <meshtensor/dtensor/redistribute.hpp>
#include <meshtensor/kernels/elementwise.hpp>
#include <meshtensor/kernels/fixed_point.hpp>
#include <meshtensor/kernels/pack.hpp>
#include <meshtensor/mesh/layout.hpp>
#include <meshtensor/plan/exchange.hpp>

namespace meshtensor::dtensor {

namespace {
using plan::Step;
using plan::StepKind;

std::mutex warning_mutex;
std::function<void(const std::string&)> warning_handler;
std::set<std::string> warned;

void warn_once(const std::string& key, const std::string& message) {
  const std::lock_guard lock(warning_mutex);
  if (!warned.insert(key).second) return;
  if (warning_handler) {
    warning_handler(message);
  } else {
    std::cerr << "meshtensor: warning: " << message << '\n';
  }
}

Shape with_width(const Shape& shape, std::int64_t width) {
  if (width == 1) return shape;
  std::vector<std::int64_t> dims = shape.dims();
  dims.push_back(width);
  return Shape(std::move(dims));
}

std::vector<Tensor> views_of(const Tensor& tensor, const Layout& holds,
                             const std::vector<Layout>& pieces) {
  std::vector<Tensor> views;
  views.reserve(pieces.size());
  for (const Layout& piece : pieces)
    views.push_back(block_view(tensor, holds, piece));
  return views;
}

std::vector<std::int64_t> counts_of(const std::vector<Layout>& pieces, std::int64_t width) {
  std::vector<std::int64_t> counts;
  counts.reserve(pieces.size());
  for (const Layout& piece : pieces)
    counts.push_back(piece.numel() * width);
  return counts;
}

std::int64_t total(const std::vector<std::int64_t>& counts) {
  std::int64_t sum = 0;
  for (std::int64_t count : counts)
    sum += count;
  return sum;
}

// Runs the steps of a plan on one rank's block. Elements may be `width` values wide (exact mode
// carries fixed-point limbs and a key per element); the layouts address elements.
class Executor {
 public:
  Executor(const plan::Plan& plan, comm::MeshGroups& groups, const RedistributeOptions& options,
           comm::CollectiveOptions reduce_options, std::int64_t width)
      : plan_(plan), groups_(groups), reduce_options_(reduce_options), width_(width) {
    move_options_.timeout = options.timeout;
  }

  /// Runs the steps; `skip_scale` leaves out the scale step, `skip_all_reduce` the all_reduce
  /// steps (the caller reduced already).
  Tensor run(Tensor current, bool skip_scale, bool skip_all_reduce = false) {
    current_ = std::move(current);
    for (const Step& step : plan_.steps) {
      if (step.kind == StepKind::scale && skip_scale) continue;
      if (step.kind == StepKind::all_reduce && skip_all_reduce) continue;
      run_step(step);
    }
    return std::move(current_);
  }

  // Step by step, for a batch (execute_plans): begin, then run_to_collective and a collective
  // done by the batch through the pieces below, until run_to_collective returns null; then end.

  /// Starts on `current` at the first step.
  void begin(Tensor current) {
    current_ = std::move(current);
    next_ = 0;
  }
  /// Runs the local steps up to the next collective and returns it (advanced past), or null
  /// when the plan has run to its end.
  const Step* run_to_collective() {
    while (next_ < plan_.steps.size()) {
      const Step& step = plan_.steps[next_++];
      if (plan::is_collective(step.kind)) return &step;
      run_step(step);
    }
    return nullptr;
  }
  /// The tensor the plan left.
  Tensor end() { return std::move(current_); }

 private:
  Layout layout(const PlacementSpec& spec) const {
    return local_layout(plan_.mesh, spec, plan_.shape, groups_.rank());
  }

  comm::Communicator& group(const Step& step) {
    if (step.two_level) {
      return *groups_.two_level_group(step.group, comm::TwoLevelChoice::always, move_options_);
    }
    return *groups_.group(step.group, move_options_);
  }

  void run_step(const Step& step) {
    switch (step.kind) {
      case StepKind::local_pack: {
        // reduce_scatter: every member's new block out of the shared old one; all_to_all: the
        // pieces this rank sends.
        const Layout mine = layout(step.before);
        const std::vector<Layout> pieces =
            next_kind(step) == StepKind::reduce_scatter
                ? plan::member_blocks(plan_.mesh, step.group, step.after, plan_.shape,
                                      groups_.rank())
                : plan::group_exchange(plan_.mesh, step, plan_.shape, groups_.rank()).send;
        const std::vector<Tensor> views = views_of(current_, mine, pieces);
        packed_ = Tensor({total(counts_of(pieces, width_))}, current_.dtype());
        kernels::pack(views, packed_.bytes());
        return;
      }
      case StepKind::all_reduce: {
        comm::CollectiveOptions options = reduce_options_;
        options.op = reduce_op(step);
        group(step).all_reduce(current_, options);
        return;
      }
      case StepKind::reduce_scatter: {
        Tensor input = packed_.defined() ? packed_ : current_.flatten();
        Tensor output(with_width(layout(step.after).local_shape, width_), current_.dtype());
        comm::CollectiveOptions options = reduce_options_;
        options.op = reduce_op(step);
        group(step).reduce_scatter(input, output.flatten(), widen(member_counts(step.after, step)),
                                   options);
        packed_ = Tensor();
        current_ = std::move(output);
        return;
      }
      case StepKind::all_gather: {
        const std::vector<std::int64_t> counts = gather_counts(step);
        Tensor output({total(counts)}, current_.dtype());
        group(step).all_gather(current_.flatten(), output, counts, move_options_);
        finish_gather(step, std::move(output));
        return;
      }
      case StepKind::all_to_all: {
        plan::GroupExchange exchange = exchange_of(step);
        Tensor received({total(widen(exchange.recv_counts))}, current_.dtype());
        group(step).all_to_all(packed_, received, widen(exchange.send_counts),
                               widen(exchange.recv_counts), move_options_);
        finish_exchange(std::move(received), std::move(exchange));
        return;
      }
      case StepKind::local_unpack: {
        const Layout after = layout(step.after);
        Tensor output = Tensor::zeros(with_width(after.local_shape, width_), current_.dtype());
        std::vector<Tensor> pieces = views_of(output, after, received_from_);
        kernels::unpack(received_.bytes(), pieces);
        received_ = Tensor();
        current_ = std::move(output);
        return;
      }
      case StepKind::local_chunk:
        current_ = block_view(current_, layout(step.before), layout(step.after)).clone();
        return;
      case StepKind::local_partial: {
        const Layout after = layout(step.after);
        Tensor output = Tensor::zeros(with_width(after.local_shape, width_), current_.dtype());
        if (plan_.mesh.group_position(groups_.rank(), step.keep_dims) == 0) {
          block_view(output, after, layout(step.before)).copy_from(current_);
        }
        current_ = std::move(output);
        return;
      }
      case StepKind::scale:
        kernels::divide(current_, static_cast<double>(step.divisor));
        return;
    }
  }

  // The pieces of the collective steps, also used by a batch of executors that moves several
  // tensors with one collective (execute_plans).

  /// What each member of an all_gather step contributes (in the collective's units).
  std::vector<std::int64_t> gather_counts(const Step& step) const {
    return widen(member_counts(step.before, step));
  }
  /// This rank's contribution to an all_gather step.
  Tensor gather_input() const { return current_.flatten(); }
  /// Takes the all_gather's output (the members' blocks in member order).
  void finish_gather(const Step& step, Tensor output) {
    if (next_kind(step) == StepKind::local_unpack) {
      received_ = std::move(output);
      received_from_ =
          plan::member_blocks(plan_.mesh, step.group, step.before, plan_.shape, groups_.rank());
      return;
    }
    current_ = output.reshape(with_width(layout(step.after).local_shape, width_));
  }
  /// The exchange of an all_to_all step (element counts).
  plan::GroupExchange exchange_of(const Step& step) const {
    return plan::group_exchange(plan_.mesh, step, plan_.shape, groups_.rank());
  }
  /// What this rank sends in an all_to_all step (packed by the step before).
  const Tensor& exchange_input() const { return packed_; }
  /// Takes what the all_to_all delivered.
  void finish_exchange(Tensor received, plan::GroupExchange exchange) {
    packed_ = Tensor();
    received_ = std::move(received);
    received_from_ = std::move(exchange.recv);
  }

  std::vector<std::int64_t> member_counts(const PlacementSpec& spec, const Step& step) const {
    return plan::member_counts(plan_.mesh, step.group, spec, plan_.shape, groups_.rank());
  }

  // Element counts in the units the collectives move (width values per element).
  std::vector<std::int64_t> widen(std::vector<std::int64_t> counts) const {
    for (std::int64_t& count : counts)
      count *= width_;
    return counts;
  }

  StepKind next_kind(const Step& step) const {
    const auto index = static_cast<std::size_t>(&step - plan_.steps.data());
    return index + 1 < plan_.steps.size() ? plan_.steps[index + 1].kind : StepKind::scale;
  }

  ReduceOp reduce_op(const Step& step) const {
    return step.op == ReduceOp::sum ? reduce_options_.op : step.op;
  }

  const plan::Plan& plan_;
  comm::MeshGroups& groups_;
  comm::CollectiveOptions reduce_options_;
  comm::CollectiveOptions move_options_;
  std::int64_t width_;
  Tensor current_;
  Tensor packed_;
  Tensor received_;
  std::vector<Layout> received_from_;
  std::size_t next_ = 0;

  friend class BatchExecutor;
};

/// Several executors whose plans have the same collectives (kinds and groups, in order) and
/// only move data: each collective runs once for all, every member's pieces back to back in
/// executor order, and is split back into each executor's buffers.
class BatchExecutor {
 public:
  explicit BatchExecutor(std::vector<Executor*> executors) : executors_(std::move(executors)) {}

  void run() {
    while (true) {
      std::vector<const Step*> steps;
      for (Executor* e : executors_)
        steps.push_back(e->run_to_collective());
      if (steps.front() == nullptr) return;
      if (steps.front()->kind == StepKind::all_gather) {
        all_gather(steps);
      } else {
        all_to_all(steps);
      }
    }
  }

 private:
  /// Each executor's segments (counts[e][m]) back to back per member: the fused buffer's layout.
  static std::vector<std::int64_t> fused_counts(
      const std::vector<std::vector<std::int64_t>>& counts) {
    std::vector<std::int64_t> fused(counts.front().size(), 0);
    for (const auto& c : counts)
      for (std::size_t m = 0; m < c.size(); ++m)
        fused[m] += c[m];
    return fused;
  }

  /// Copies executor segments between the fused buffer (per member, every executor's segment
  /// in executor order) and the executors' member-major buffers: into `parts` with
  /// `to_fused` false, out of them with true.
  static void copy_segments(const Tensor& fused,
                            const std::vector<std::vector<std::int64_t>>& counts,
                            std::vector<Tensor>& parts, bool to_fused) {
    std::int64_t at = 0;
    std::vector<std::int64_t> offsets(parts.size(), 0);
    for (std::size_t m = 0; m < counts.front().size(); ++m) {
      for (std::size_t e = 0; e < parts.size(); ++e) {
        const std::int64_t n = counts[e][m];
        if (n > 0) {
          Tensor part = parts[e].narrow(0, offsets[e], n);
          Tensor whole = fused.narrow(0, at, n);
          if (to_fused) {
            whole.copy_from(part);
          } else {
            part.copy_from(whole);
          }
        }
        offsets[e] += n;
        at += n;
      }
    }
  }

  void all_gather(const std::vector<const Step*>& steps) {
    std::vector<std::vector<std::int64_t>> counts;
    std::vector<Tensor> inputs;
    std::vector<std::int64_t> mine;
    const DType dtype = executors_.front()->current_.dtype();
    for (std::size_t e = 0; e < executors_.size(); ++e) {
      counts.push_back(executors_[e]->gather_counts(*steps[e]));
      inputs.push_back(executors_[e]->gather_input());
      mine.push_back(inputs.back().numel());
    }
    Tensor input({total(mine)}, dtype);
    std::int64_t at = 0;
    for (const Tensor& part : inputs) {
      if (part.numel() > 0) input.narrow(0, at, part.numel()).copy_from(part);
      at += part.numel();
    }
    Executor& first = *executors_.front();
    const std::vector<std::int64_t> fused = fused_counts(counts);
    Tensor output({total(fused)}, dtype);
    first.group(*steps.front()).all_gather(input, output, fused, first.move_options_);
    std::vector<Tensor> parts;
    for (const auto& c : counts)
      parts.emplace_back(Shape{total(c)}, dtype);
    copy_segments(output, counts, parts, false);
    for (std::size_t e = 0; e < executors_.size(); ++e)
      executors_[e]->finish_gather(*steps[e], std::move(parts[e]));
  }

  void all_to_all(const std::vector<const Step*>& steps) {
    std::vector<plan::GroupExchange> exchanges;
    std::vector<std::vector<std::int64_t>> send;
    std::vector<std::vector<std::int64_t>> recv;
    std::vector<Tensor> inputs;
    const DType dtype = executors_.front()->current_.dtype();
    for (std::size_t e = 0; e < executors_.size(); ++e) {
      exchanges.push_back(executors_[e]->exchange_of(*steps[e]));
      send.push_back(exchanges.back().send_counts);
      recv.push_back(exchanges.back().recv_counts);
      inputs.push_back(executors_[e]->exchange_input());
    }
    Tensor input({total(fused_counts(send))}, dtype);
    copy_segments(input, send, inputs, true);
    Executor& first = *executors_.front();
    Tensor output({total(fused_counts(recv))}, dtype);
    first.group(*steps.front())
        .all_to_all(input, output, fused_counts(send), fused_counts(recv), first.move_options_);
    std::vector<Tensor> parts;
    for (const auto& c : recv)
      parts.emplace_back(Shape{total(c)}, dtype);
    copy_segments(output, recv, parts, false);
    for (std::size_t e = 0; e < executors_.size(); ++e)
      executors_[e]->finish_exchange(std::move(parts[e]), std::move(exchanges[e]));
  }

  std::vector<Executor*> executors_;
};

bool single_reduction(const plan::Plan& plan) {
  if (plan.collectives() != 1) return false;
  for (const Step& step : plan.steps) {
    if (step.kind == StepKind::all_reduce || step.kind == StepKind::reduce_scatter) {
      return plan.avg_divisor == 1 || plan.avg_divisor == step.group_size;
    }
  }
  return false;
}

bool reduces_in_fixed_point(const plan::Plan& plan, const RedistributeOptions& options) {
  if (options.mode != comm::ReductionMode::exact || !is_floating(plan.dtype)) return false;
  for (const Step& step : plan.steps) {
    if ((step.kind == StepKind::all_reduce || step.kind == StepKind::reduce_scatter) &&
        step.op == ReduceOp::sum) {
      return true;
    }
  }
  return false;
}

// Exact mode over several reducing steps: every element travels as its fixed-point limbs plus
// one lane for its scale key (held by one contributor, zeros elsewhere, so that summing keeps
// it). Integer sums are exact in any order; one rounding at the end.
Tensor execute_in_fixed_point(const plan::Plan& plan, comm::MeshGroups& groups, const Tensor& local,
                              const RedistributeOptions& options) {
  const kernels::FixedPointFormat format = kernels::fixed_point_format(plan.dtype);
  std::int64_t addends = 1;
  for (int m : plan.reduced_dims)
    addends *= plan.mesh.size(m);
  if (addends > kernels::kMaxExactAddends) {
    throw InvalidArgument(fmt::format(
        "exact redistribute {} -> {} on mesh {} adds {} contributions per element; exact mode "
        "allows at most {}",
        plan.from.to_string(), plan.to.to_string(), plan.mesh.to_string(), addends,
        kernels::kMaxExactAddends));
  }
  const Tensor values = local.contiguous().flatten();
  const std::int64_t count = values.numel();
  Tensor keys({count}, DType::u8);
  kernels::fixed_point_keys(values, keys);
  comm::CollectiveOptions max_options;
  max_options.op = ReduceOp::max;
  max_options.timeout = options.timeout;
  if (options.allow_flattened_groups) {
    groups.group(plan.reduced_dims, max_options)->all_reduce(keys, max_options);
  } else {
    for (int m : plan.reduced_dims)
      groups.group(std::vector<int>{m}, max_options)->all_reduce(keys, max_options);
  }
  const std::int64_t limbs = format.limbs;
  Tensor fixed({count * limbs}, DType::i64);
  kernels::encode_fixed_point(values, keys, fixed);
  const bool holds_key = plan.mesh.group_position(groups.rank(), plan.reduced_dims) == 0;
  Tensor wide(with_width(local.shape(), limbs + 1), DType::i64);
  {
    auto out = wide.values<std::int64_t>();
    const auto in = std::as_const(fixed).values<std::int64_t>();
    const auto key = std::as_const(keys).values<std::uint8_t>();
    for (std::int64_t i = 0; i < count; ++i) {
      for (std::int64_t l = 0; l < limbs; ++l)
        out[static_cast<std::size_t>(i * (limbs + 1) + l)] =
            in[static_cast<std::size_t>(i * limbs + l)];
      out[static_cast<std::size_t>(i * (limbs + 1) + limbs)] =
          holds_key ? key[static_cast<std::size_t>(i)] : 0;
    }
  }
  comm::CollectiveOptions sum_options;
  sum_options.op = ReduceOp::sum;
  sum_options.mode = comm::ReductionMode::ordered;
  sum_options.timeout = options.timeout;
  Executor executor(plan, groups, options, sum_options, limbs + 1);
  const Tensor result = executor.run(std::move(wide), /*skip_scale=*/true);

  const Shape shape = local_layout(plan.mesh, plan.to, plan.shape, groups.rank()).local_shape;
  const std::int64_t out_count = shape.numel();
  Tensor out_fixed({out_count * limbs}, DType::i64);
  Tensor out_keys({out_count}, DType::u8);
  {
    const auto in = result.values<std::int64_t>();
    auto limb_out = out_fixed.values<std::int64_t>();
    auto key_out = out_keys.values<std::uint8_t>();
    for (std::int64_t i = 0; i < out_count; ++i) {
      for (std::int64_t l = 0; l < limbs; ++l)
        limb_out[static_cast<std::size_t>(i * limbs + l)] =
            in[static_cast<std::size_t>(i * (limbs + 1) + l)];
      key_out[static_cast<std::size_t>(i)] =
          static_cast<std::uint8_t>(in[static_cast<std::size_t>(i * (limbs + 1) + limbs)]);
    }
  }
  Tensor output(shape, plan.dtype);
  kernels::decode_fixed_point(out_fixed, out_keys, plan.avg_divisor, output.flatten());
  return output;
}
// Exact plans whose only reductions are all_reduce steps over groups that multiply out to the
// avg divisor (or no avg): the all_reduces commute with the local steps, so they run first as one
// fixed-point chain (keys, then limbs, one rounding) and the rest of the plan follows.
std::optional<Tensor> all_reduce_chain_first(const plan::Plan& plan, comm::MeshGroups& groups,
                                             const Tensor& local,
                                             const RedistributeOptions& options) {
  std::vector<std::shared_ptr<comm::Communicator>> chain;
  std::int64_t product = 1;
  comm::CollectiveOptions group_options;
  group_options.timeout = options.timeout;
  for (const Step& step : plan.steps) {
    if (!plan::is_collective(step.kind)) continue;
    if (step.kind != StepKind::all_reduce) return std::nullopt;
    chain.push_back(step.two_level ? groups.two_level_group(
                                         step.group, comm::TwoLevelChoice::always, group_options)
                                   : groups.group(step.group, group_options));
    product *= step.group_size;
  }
  if (plan.avg_divisor != 1 && plan.avg_divisor != product) return std::nullopt;
  std::vector<comm::Communicator*> members;
  for (const auto& group : chain)
    members.push_back(group.get());
  comm::CollectiveOptions reduce_options;
  reduce_options.mode = comm::ReductionMode::exact;
  reduce_options.op = plan.avg_divisor > 1 ? ReduceOp::avg : ReduceOp::sum;
  reduce_options.timeout = options.timeout;
  Tensor current = local.clone();
  comm::all_reduce_chain(members, current, reduce_options);
  Executor executor(plan, groups, options, reduce_options, 1);
  return executor.run(std::move(current), /*skip_scale=*/true, /*skip_all_reduce=*/true);
}
}  // namespace

void set_warning_handler(std::function<void(const std::string&)> handler) {
  const std::lock_guard lock(warning_mutex);
  warning_handler = std::move(handler);
}

plan::PlanOptions plan_options(const RedistributeOptions& options, const Topology& topology,
                               DType dtype) {
  plan::PlanOptions out;
  out.merge = options.merge && options.allow_flattened_groups;
  out.cost = options.cost;
  if (options.topology_aware) out.topology = topology;
  out.order_sensitive = options.mode == comm::ReductionMode::ordered;
  if (options.mode == comm::ReductionMode::exact && is_floating(dtype))
    out.fixed_point_bytes = 8 * kernels::fixed_point_format(dtype).limbs;
  return out;
}

std::shared_ptr<const plan::Plan> plan_for(const comm::MeshGroups& groups,
                                           const PlacementSpec& from, const PlacementSpec& to,
                                           const Shape& shape, DType dtype,
                                           const RedistributeOptions& options) {
  return plan_for(groups.mesh(), from, to, shape, dtype, options, groups.topology());
}

std::shared_ptr<const plan::Plan> plan_for(const DeviceMesh& mesh, const PlacementSpec& from,
                                           const PlacementSpec& to, const Shape& shape, DType dtype,
                                           const RedistributeOptions& options) {
  return plan_for(mesh, from, to, shape, dtype, options, Topology());
}

std::shared_ptr<const plan::Plan> plan_for(const DeviceMesh& mesh, const PlacementSpec& from,
                                           const PlacementSpec& to, const Shape& shape, DType dtype,
                                           const RedistributeOptions& options,
                                           const Topology& topology) {
  plan::PlanOptions plan_options = dtensor::plan_options(options, topology, dtype);
  auto plan = plan::default_plan_cache().get(mesh, from, to, shape, dtype, plan_options);
  if (options.merge && !options.allow_flattened_groups) {
    plan_options.merge = true;
    const auto merged = plan::default_plan_cache().get(mesh, from, to, shape, dtype, plan_options);
    for (const Step& step : merged->steps) {
      if (!plan::is_collective(step.kind) || step.group.size() < 2) continue;
      std::vector<std::string> names;
      for (int m : step.group)
        names.push_back(mesh.dim_name(m));
      const std::string dims = fmt::format("({})", fmt::join(names, ","));
      warn_once(fmt::format("{}|{}|forbidden", mesh.to_string(), dims),
                fmt::format("mesh {}: flattened group over {} not created (flattened groups are "
                            "forbidden); {} runs as per-dim steps",
                            mesh.to_string(), dims, plan::step_kind_name(step.kind)));
    }
  }
  return plan;
}

namespace {

/// InvalidArgument unless `plan` runs on the mesh of `groups` and `local` is this rank's block
/// of its source.
void check_local(const plan::Plan& plan, comm::MeshGroups& groups, const Tensor& local) {
  if (!(groups.mesh().sizes() == plan.mesh.sizes())) {
    throw InvalidArgument(fmt::format("plan for mesh {} run on mesh {}", plan.mesh.to_string(),
                                      groups.mesh().to_string()));
  }
  const Layout from = local_layout(plan.mesh, plan.from, plan.shape, groups.rank());
  if (!local.defined() || local.shape() != from.local_shape || local.dtype() != plan.dtype) {
    throw InvalidArgument(fmt::format(
        "rank {} holds {}, but spec {} of a {} {} tensor gives it a {} block", groups.rank(),
        local.defined()
            ? fmt::format("a {} {} block", local.shape().to_string(), dtype_name(local.dtype()))
            : std::string("no tensor"),
        plan.from.to_string(), plan.shape.to_string(), dtype_name(plan.dtype),
        from.local_shape.to_string()));
  }
}

/// The collectives of a plan that only moves data (kinds and groups), or nullopt when it
/// reduces: what plans must share to run as one batch.
std::optional<std::string> movement_signature(const plan::Plan& plan) {
  std::string signature = fmt::format("{}|{}", plan.mesh.to_string(), dtype_name(plan.dtype));
  for (const Step& step : plan.steps) {
    if (step.kind == StepKind::all_reduce || step.kind == StepKind::reduce_scatter ||
        step.kind == StepKind::scale || step.kind == StepKind::local_partial)
      return std::nullopt;
    if (plan::is_collective(step.kind))
      signature +=
          fmt::format("|{}:{}", plan::step_kind_name(step.kind), fmt::join(step.group, ","));
  }
  return signature;
}

}  // namespace

std::int64_t batch_collectives(std::span<const plan::Plan* const> plans) {
  std::set<std::string> batches;
  std::int64_t count = 0;
  for (const plan::Plan* plan : plans) {
    const std::optional<std::string> signature = movement_signature(*plan);
    if (!signature) {
      count += plan->collectives();
    } else if (batches.insert(*signature).second) {
      count += plan->collectives();
    }
  }
  return count;
}

std::vector<Tensor> execute_plans(std::span<const plan::Plan* const> plans,
                                  comm::MeshGroups& groups, std::span<const Tensor> locals,
                                  const RedistributeOptions& options) {
  if (plans.size() != locals.size()) {
    throw InvalidArgument(fmt::format("{} plans for {} tensors", plans.size(), locals.size()));
  }
  std::vector<Tensor> results(plans.size());
  std::map<std::string, std::vector<std::size_t>> batches;
  for (std::size_t i = 0; i < plans.size(); ++i) {
    check_local(*plans[i], groups, locals[i]);
    const std::optional<std::string> signature = movement_signature(*plans[i]);
    if (signature) {
      batches[*signature].push_back(i);
    } else {
      results[i] = execute_plan(*plans[i], groups, locals[i], options);
    }
  }
  comm::CollectiveOptions unused;
  unused.mode = options.mode;
  unused.timeout = options.timeout;
  for (const auto& [signature, members] : batches) {
    std::vector<std::unique_ptr<Executor>> executors;
    std::vector<Executor*> batch;
    for (const std::size_t i : members) {
      executors.push_back(std::make_unique<Executor>(*plans[i], groups, options, unused, 1));
      executors.back()->begin(locals[i].clone());
      batch.push_back(executors.back().get());
    }
    BatchExecutor(batch).run();
    for (std::size_t k = 0; k < members.size(); ++k)
      results[members[k]] = executors[k]->end();
  }
  return results;
}

Tensor execute_plan(const plan::Plan& plan, comm::MeshGroups& groups, const Tensor& local,
                    const RedistributeOptions& options) {
  check_local(plan, groups, local);
  if (reduces_in_fixed_point(plan, options) && !single_reduction(plan)) {
    if (auto chained = all_reduce_chain_first(plan, groups, local, options)) return *chained;
    return execute_in_fixed_point(plan, groups, local, options);
  }
  comm::CollectiveOptions reduce_options;
  reduce_options.mode = options.mode;
  reduce_options.timeout = options.timeout;
  // One exact collective rounds once by itself: a pure avg reduction divides inside it.
  const bool divide_inside =
      options.mode == comm::ReductionMode::exact && is_floating(plan.dtype) && plan.avg_divisor > 1;
  reduce_options.op = divide_inside ? ReduceOp::avg : ReduceOp::sum;
  Executor executor(plan, groups, options, reduce_options, 1);
  return executor.run(local.clone(), divide_inside);
}

}  // namespace meshtensor::dtensor
