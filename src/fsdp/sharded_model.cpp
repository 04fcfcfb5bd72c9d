#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string_view>
#include <type_traits>
#include <utility>

#include <fmt/format.h>

#include <meshtensor/comm/binned_reduction.hpp>
#include <meshtensor/core/digest.hpp>
#include <meshtensor/core/error.hpp>
#include <meshtensor/core/profile.hpp>
#include <meshtensor/core/random.hpp>
#include <meshtensor/fsdp/reduction.hpp>
#include <meshtensor/fsdp/sharded_model.hpp>
#include <meshtensor/kernels/elementwise.hpp>

namespace meshtensor::fsdp {

namespace {

// Each group of ranks has one communicator per channel; the world's own (channel 0) is left to
// the caller.
constexpr int kUnshardChannel = 1;
constexpr int kReduceChannel = 2;
constexpr int kControlChannel = 3;

enum class OrderKind : std::uint8_t { unshard, reduce_scatter, all_reduce };
constexpr std::array<std::string_view, 3> kOrderNames = {"all-gather (unshard)", "reduce-scatter",
                                                         "all-reduce"};

std::int64_t bytes_of(const Tensor& t) {
  return t.defined() ? static_cast<std::int64_t>(t.nbytes()) : 0;
}

void require_compute_dtype(DType dtype, const char* what) {
  if (dtype != DType::f32 && dtype != DType::bf16 && dtype != DType::f16) {
    throw InvalidArgument(
        fmt::format("{} {} is not one of f32, bf16, f16", what, dtype_name(dtype)));
  }
}

// "layers.0" from "layers.0.weight", "layers.0.bias".
std::string common_prefix(const std::vector<nn::Parameter*>& parameters) {
  std::string prefix = parameters.front()->name;
  const std::size_t dot = prefix.rfind('.');
  prefix = dot == std::string::npos ? std::string() : prefix.substr(0, dot);
  for (const nn::Parameter* p : parameters)
    if (!p->name.starts_with(prefix)) return {};
  return prefix;
}

}  // namespace

// A queue of one rank's work on one group of ranks, with that group's communicator for one
// channel (null for a group of one rank: nothing to communicate).
struct ShardedModule::Lane {
  std::shared_ptr<comm::Communicator> comm;
  std::string name;
  comm::WorkQueue queue;
  ~Lane() { queue.stop(); }
};

namespace {

/// Bytes of one element of binned sums: its bin and three digit sums.
constexpr std::int64_t kBinnedBytes = 4 + 3 * 8;

/// Exact sums carried between the backwards of one step. The first sums taken are moved in
/// rather than copied; storage that holds nothing is emptied only when it is read.
struct CarriedSums {
  kernels::BinnedSums sums;
  bool holds_sums = false;

  /// Makes the storage `count` empty elements when it holds nothing.
  void reserve(std::int64_t count) {
    if (holds_sums) return;
    if (sums.count() == count) {
      sums.clear();
    } else {
      sums = kernels::BinnedSums(count);
    }
  }
  /// Adds the sums of `from` (same count), leaving `from` holding unspecified values (or none):
  /// its owner makes, empties or overwrites it before its next use.
  void take(kernels::BinnedSums& from) {
    if (!holds_sums) {
      sums = std::move(from);
      from = kernels::BinnedSums();
      holds_sums = true;
      return;
    }
    kernels::merge_binned_sums(sums, from);
  }
  /// Adds everything `other` holds and leaves it holding nothing.
  void take(CarriedSums& other) {
    if (!other.holds_sums) return;
    take(other.sums);
    other.holds_sums = false;
  }
  /// Back to holding nothing.
  void reset() { holds_sums = false; }
  /// Holding nothing, and its storage handed back.
  void release() {
    sums = kernels::BinnedSums();
    holds_sums = false;
  }
};

}  // namespace

// What a group's reductions carry between the backwards of one step (this rank's shard only).
struct ShardedModule::StepAccumulator {
  Tensor partial;                     // ordered: f32 sums over the shard group, not yet all-reduced
  Tensor pending;                     // ordered: a reduce-scatter output its all-reduce will take
  CarriedSums shard;                  // exact: reduced over the shard group only
  CarriedSums full;                   // exact: reduced over shard and replicate groups
  kernels::BinnedSums slice;          // exact: this rank's slice of a reduce-scatter (scratch)
  kernels::BinnedSums replica_slice;  // exact: the other replicas' states of its slice (scratch)
};

ShardedModule::ShardedModule(ShardedModel& model, std::vector<nn::Module*> members,
                             std::vector<nn::Parameter*> parameters, const FsdpConfig& config,
                             std::string name, std::size_t index)
    : model_(model),
      members_(std::move(members)),
      parameters_(std::move(parameters)),
      config_(config),
      name_(std::move(name)),
      index_(index),
      layout_([&] {
        std::vector<Shape> shapes;
        std::vector<int> dims;
        for (const nn::Parameter* p : parameters_) {
          shapes.push_back(p->value.shape());
          dims.push_back(config.shard_dim < p->value.rank() ? config.shard_dim : 0);
        }
        const DeviceMesh& mesh = model.groups().mesh();
        std::int64_t ranks = 1;
        for (const int d : config.shard_mesh_dims)
          ranks *= mesh.size(d);
        return ShardLayout(std::move(shapes), std::move(dims), static_cast<int>(ranks));
      }()) {
  unshard_lane_ = model.lane(config_.shard_mesh_dims, kUnshardChannel, "unshard");
  reduce_lane_ = model.lane(config_.shard_mesh_dims, kReduceChannel, "reduce");
  if (!config_.replicate_mesh_dims.empty()) {
    replicate_lane_ = model.lane(config_.replicate_mesh_dims, kReduceChannel, "reduce");
    if (!replicate_lane_->comm) replicate_lane_.reset();
  }
  if (replicate_lane_ && layout_.ranks() > 1 && !model.groups().topology().single_level()) {
    std::vector<int> both = config_.shard_mesh_dims;
    both.insert(both.end(), config_.replicate_mesh_dims.begin(), config_.replicate_mesh_dims.end());
    both_lane_ = model.lane(both, kReduceChannel, "reduce");
    const int replicas = replicate_lane_->comm->size();
    if (both_lane_->comm->rank() != shard_rank() * replicas + replicate_lane_->comm->rank()) {
      throw InvalidArgument(fmt::format(
          "sharded module {}: the group over the shard and replicate dims does not order its "
          "members shard-major (rank {}, shard {}, replica {})",
          name_, both_lane_->comm->rank(), shard_rank(), replicate_lane_->comm->rank()));
    }
    if (config_.gather_from_host_replicas) {
      unit_gather_ = plan_unit_gather(model.groups().mesh(), model.groups().topology(),
                                      config_.shard_mesh_dims, config_.replicate_mesh_dims,
                                      model.groups().rank());
    }
    if (unit_gather_) unit_unshard_lane_ = model.unit_lane(both, kUnshardChannel, "unshard");
  }
  const int me = shard_rank();
  shard_values_ = Tensor::zeros(Shape{layout_.counts()[static_cast<std::size_t>(me)]}, DType::f32);
  shard_grads_ = Tensor::zeros(shard_values_.shape(), DType::f32);
  for (std::size_t p = 0; p < parameters_.size(); ++p) {
    Tensor& full = parameters_[p]->value;
    if (full.dtype() != DType::f32) {
      throw InvalidArgument(fmt::format("parameter '{}' is {}, not f32", parameters_[p]->name,
                                        dtype_name(full.dtype())));
    }
    const Chunk c = layout_.chunk(p, me);
    const Tensor mine = full.rank() == 0 ? full : full.narrow(layout_.dim(p), c.offset, c.size);
    if (mine.numel() > 0) layout_.chunk_view(shard_values_, p, me).copy_from(mine);
    full = Tensor();  // the module holds no full copy until it is gathered
    parameters_[p]->grad = Tensor();
  }
  received_.assign(parameters_.size(), false);
  accumulator_ = std::make_shared<StepAccumulator>();
  model.memory().add(MemoryKind::parameters, bytes_of(shard_values_));
  model.memory().add(MemoryKind::gradients, bytes_of(shard_grads_));
}

ShardedModule::~ShardedModule() {
  // Work in flight uses this group's members: let it finish (errors were reported to waiters).
  try {
    unshard_work_.wait();
  } catch (...) {  // NOLINT(bugprone-empty-catch): already reported through the handle
  }
  try {
    reduce_work_.wait();
  } catch (...) {  // NOLINT(bugprone-empty-catch)
  }
}

int ShardedModule::shard_rank() const {
  return static_cast<int>(
      model_.groups().mesh().group_position(model_.groups().rank(), config_.shard_mesh_dims));
}

int ShardedModule::replicate_size() const {
  return replicate_lane_ ? replicate_lane_->comm->size() : 1;
}

Tensor ShardedModule::local_shard(std::size_t p) const {
  return layout_.chunk_view(shard_values_, p, shard_rank());
}

Layout ShardedModule::local_block(std::size_t p) const {
  const Shape& shape = layout_.shape(p);
  Layout block{layout_.chunk_shape(p, shard_rank()),
               std::vector<std::int64_t>(static_cast<std::size_t>(shape.rank()), 0)};
  if (shape.rank() > 0)
    block.global_offset[static_cast<std::size_t>(layout_.dim(p))] =
        layout_.chunk(p, shard_rank()).offset;
  return block;
}

bool ShardedModule::is_first_replica() const {
  return model_.groups().mesh().group_position(model_.groups().rank(),
                                               config_.replicate_mesh_dims) == 0;
}

Tensor ShardedModule::local_grad(std::size_t p) const {
  return layout_.chunk_view(shard_grads_, p, shard_rank());
}

void ShardedModule::set_gradient_divide_factor(std::optional<double> factor) {
  if (factor) {
    divide_factors(DType::f32, 1, *factor);  // validates
    if (model_.options().mode == comm::ReductionMode::exact) exact_divisor(*factor);
  }
  divide_factor_ = factor;
}

void ShardedModule::set_modules_to_forward_prefetch(std::vector<ShardedModule*> modules) {
  forward_prefetch_ = std::move(modules);
}

void ShardedModule::set_modules_to_backward_prefetch(std::vector<ShardedModule*> modules) {
  backward_prefetch_ = std::move(modules);
}

double ShardedModule::divide_factor() const {
  return divide_factor_ ? *divide_factor_ : static_cast<double>(shard_size() * replicate_size());
}

UnshardHandle ShardedModule::unshard() {
  if (gathered_) return UnshardHandle(unshard_work_);
  gathered_ = true;
  model_.record_order(static_cast<int>(OrderKind::unshard), *this);
  const auto task = [this] {
    const Tracer::Span span(model_.tracer(), "all_gather " + name_, "unshard",
                            (unit_unshard_lane_ ? unit_unshard_lane_ : unshard_lane_)->name);
    full_.clear();
    const DType dtype = config_.param_dtype;
    if (!unshard_lane_->comm) {
      // One shard holds everything: the parameters are views of it (no copy) unless they are
      // to be seen rounded to a narrower dtype.
      const Tensor values =
          dtype == DType::f32 ? shard_values_ : kernels::rounded_values(shard_values_, dtype);
      if (dtype != DType::f32) model_.memory().add(MemoryKind::unsharded, bytes_of(values));
      for (std::size_t p = 0; p < parameters_.size(); ++p)
        full_.push_back(layout_.chunk_view(values, p, 0));
    } else {
      const Tensor send =
          dtype == DType::f32 ? shard_values_ : kernels::convert(shard_values_, dtype);
      Tensor gathered(Shape{layout_.total()}, dtype);
      model_.memory().add(MemoryKind::unsharded, bytes_of(gathered));
      gather_segments(send, gathered);
      std::int64_t bytes = 0;
      for (std::size_t p = 0; p < parameters_.size(); ++p) {
        full_.emplace_back(layout_.shape(p), DType::f32);
        bytes += bytes_of(full_.back());
      }
      model_.memory().add(MemoryKind::unsharded, bytes);
      layout_.unpack(dtype == DType::f32 ? gathered : kernels::convert(gathered, DType::f32),
                     full_);
      model_.memory().add(MemoryKind::unsharded, -bytes_of(gathered));
    }
    for (std::size_t p = 0; p < parameters_.size(); ++p)
      parameters_[p]->value = full_[p];
  };
  unshard_work_ = unshard_lane_->queue.submit(task);
  return UnshardHandle(unshard_work_);
}

void ShardedModule::gather_segments(const Tensor& send, const Tensor& gathered) {
  comm::CollectiveOptions options;
  options.label = "unshard " + name_;
  if (!unit_gather_) {
    unshard_lane_->comm->all_gather(send, gathered, layout_.counts(), options);
    return;
  }
  // Each shard from the first member on this host holding it. The host group's members come in
  // group order, shard-major, so the senders come in shard order: the gather lands rank-major.
  std::vector<std::int64_t> counts;
  for (const int shard : unit_gather_->shard_of_place)
    counts.push_back(shard < 0 ? 0 : layout_.counts()[static_cast<std::size_t>(shard)]);
  comm::Communicator& unit = *unit_unshard_lane_->comm;
  const bool sends = counts[static_cast<std::size_t>(unit.rank())] > 0;
  unit.all_gather(sends ? send : send.narrow(0, 0, 0), gathered, counts, options);
}

void ShardedModule::reshard() {
  if (!gathered_) return;
  unshard_work_.wait();
  gathered_ = false;
  const bool owns_copy = unshard_lane_->comm || config_.param_dtype != DType::f32;
  std::int64_t bytes = 0;
  if (owns_copy) {
    if (!unshard_lane_->comm) {
      bytes = layout_.total() * 4;
    } else {
      for (const Tensor& t : full_)
        bytes += bytes_of(t);
    }
  }
  for (nn::Parameter* p : parameters_)
    p->value = Tensor();
  full_.clear();
  model_.memory().add(MemoryKind::unsharded, -bytes);
}

// What one backward's reduction of a group carries from launch to its queued steps.
struct ShardedModule::Reduction {
  std::shared_ptr<nn::DenseGradients> dense;    // ordered and native: the summed gradients
  std::shared_ptr<nn::BinnedGradients> binned;  // exact: the binned sums
  std::shared_ptr<StepAccumulator> acc;
  std::int64_t sink_bytes = 0;
  std::int64_t mine = 0;  // this rank's segment
  int replicas = 1;
  bool fused = false;      // ordered: reduce-scatter and all-reduce divide once, after both
  bool last = false;       // the last backward of the step
  bool two_level = false;  // fused over both dims: reduce-scatter there, all-gather replicas
  DType reduce_dtype = DType::f32;
  DivideFactors rs_factors;
  DivideFactors ar_factors;
  std::int64_t divisor = 0;  // exact
  std::string label;
};

std::shared_ptr<const ShardedModule::Reduction> ShardedModule::plan_reduction(bool exact,
                                                                              bool all_reduce_now) {
  auto job = std::make_shared<Reduction>();
  const int shards = shard_size();
  job->replicas = replicate_size();
  const double factor = divide_factor();
  job->last = model_.is_last_backward_;
  job->acc = accumulator_;
  // Ordered: the reduce-scatter and all-reduce of one backward divide once, after both sums;
  // after earlier partial backwards, each backward divides its shard sums by factor / replicas
  // and the all-reduce by replicas (see DESIGN).
  job->fused = !exact && all_reduce_now && job->replicas > 1 && !partial_pending_;
  const bool through_partial = !exact && job->replicas > 1 && !job->fused;
  partial_pending_ = through_partial && !all_reduce_now;
  job->reduce_dtype = config_.reduce_dtype;
  job->rs_factors =
      job->fused ? divide_factors(job->reduce_dtype,
                                  static_cast<std::int64_t>(shards) * job->replicas, factor)
                 : divide_factors(
                       job->reduce_dtype, shards,
                       job->replicas > 1 ? factor / static_cast<double>(job->replicas) : factor);
  job->ar_factors = job->fused ? job->rs_factors
                               : divide_factors(job->reduce_dtype, job->replicas,
                                                static_cast<double>(job->replicas));
  job->divisor = exact ? exact_divisor(factor) : 0;
  // On several hosts a fused ordered reduction runs over both dims at once: one reduce-scatter
  // in two levels, then an all-gather over the replicas (docs/fsdp.md, "HSDP in two levels").
  job->two_level = job->fused && both_lane_ != nullptr;
  job->dense = std::exchange(dense_sink_, nullptr);
  job->binned = std::exchange(binned_sink_, nullptr);
  job->sink_bytes = std::exchange(sink_bytes_, 0);
  job->mine = layout_.counts()[static_cast<std::size_t>(shard_rank())];
  job->label = name_;
  return job;
}

void ShardedModule::launch_reduce() {
  ShardedModel& model = model_;
  const bool exact = model.options().mode == comm::ReductionMode::exact;
  const bool all_reduce_now = replicate_size() == 1 || requires_all_reduce_;
  // One reduction in flight at a time bounds the memory of their buffers.
  model.last_reduce_scatter_.wait();
  const std::shared_ptr<const Reduction> job = plan_reduction(exact, all_reduce_now);
  model.record_order(static_cast<int>(OrderKind::reduce_scatter), *this);
  const bool runs_all_reduce = job->replicas > 1 && all_reduce_now;
  if (runs_all_reduce) model.record_order(static_cast<int>(OrderKind::all_reduce), *this);

  if (exact && job->acc->shard.sums.count() != job->mine && !job->acc->shard.holds_sums) {
    // The reduction makes the carried sums of this rank's slice.
    model.memory().add(MemoryKind::gradients, kBinnedBytes * job->mine);
  }
  Lane& first_lane = job->two_level ? *both_lane_ : *reduce_lane_;
  const comm::Work rs_work = first_lane.queue.submit([this, job, exact, runs_all_reduce] {
    if (exact) {
      reduce_scatter_exact(*job);
      // Without an all-reduce the sums round here, at the last backward of the step.
      if (!runs_all_reduce) finish_exact(*job, nullptr, job->last && job->replicas == 1);
    } else if (job->two_level) {
      const std::vector<std::int64_t> pieces = piece_counts();
      reduce_scatter_ordered(*job, *both_lane_, pieces,
                             pieces[static_cast<std::size_t>(both_lane_->comm->rank())]);
    } else {
      reduce_scatter_ordered(*job, *reduce_lane_, layout_.counts(), job->mine);
    }
  });
  model.last_reduce_scatter_ = rs_work;
  reduce_work_ = rs_work;
  if (!runs_all_reduce) return;
  reduce_work_ = replicate_lane_->queue.submit([this, job, rs_work, exact] {
    rs_work.wait();
    const Tracer::Span span(model_.tracer(), "all_reduce " + name_, "reduce",
                            replicate_lane_->name);
    if (exact) {
      finish_exact(*job, replicate_lane_->comm.get(), job->last);
    } else if (job->two_level) {
      all_gather_pieces(*job);
    } else {
      all_reduce_ordered(*job);
    }
  });
}

comm::CollectiveOptions ShardedModule::reduce_options(const std::string& what) const {
  comm::CollectiveOptions options;
  options.op = ReduceOp::sum;
  options.mode = model_.options().mode;
  options.label = what + " " + name_;
  return options;
}

void ShardedModule::reduce_scatter_exact(const Reduction& job) {
  const Tracer::Span span(model_.tracer(), "reduce_scatter " + name_, "reduce", reduce_lane_->name);
  const std::shared_ptr<comm::Communicator>& group = reduce_lane_->comm;
  kernels::BinnedSums& sums = job.binned->sums();
  if (!group) {
    job.acc->shard.take(sums);
  } else {
    // The first sums of a step reduce straight into the carried storage; later ones into the
    // scratch slice, then join.
    CarriedSums& carried = job.acc->shard;
    comm::CollectiveOptions options = reduce_options("reduce-scatter");
    options.mode = comm::ReductionMode::ordered;  // integer digit sums: exact in any order
    Tensor bins = sums.bins.clone();
    comm::CollectiveOptions max_options = options;
    max_options.op = ReduceOp::max;
    max_options.label = "reduce-scatter bins " + job.label;
    group->all_reduce(bins, max_options);
    kernels::align_bins(sums, bins);
    kernels::BinnedSums& slice = carried.holds_sums ? job.acc->slice : carried.sums;
    if (slice.count() != job.mine) slice = kernels::BinnedSums::uninitialized(job.mine);
    layout_.pack_segment(layout_.parameter_views(bins), shard_rank(), slice.bins);
    reduce_scatter_digits(*group, layout_, sums, slice, options);
    if (carried.holds_sums) {
      carried.take(slice);  // overwritten whole by the next reduce-scatter
    } else {
      carried.holds_sums = true;
    }
  }
  model_.memory().add(MemoryKind::unsharded, -job.sink_bytes);
}

void ShardedModule::reduce_scatter_ordered(const Reduction& job, const Lane& lane,
                                           const std::vector<std::int64_t>& counts,
                                           std::int64_t mine) {
  const Tracer::Span span(model_.tracer(), "reduce_scatter " + name_, "reduce", lane.name);
  const std::shared_ptr<comm::Communicator>& group = lane.comm;
  Tensor packed(Shape{layout_.total()}, DType::f32);
  model_.memory().add(MemoryKind::unsharded, bytes_of(packed));
  layout_.pack(layout_.parameter_views(job.dense->sums()), packed);
  if (job.rs_factors.pre != 1.0) kernels::divide(packed, job.rs_factors.pre);
  const Tensor send =
      job.reduce_dtype == DType::f32 ? packed : kernels::convert(packed, job.reduce_dtype);
  Tensor out(Shape{mine}, job.reduce_dtype);
  if (group) {
    group->reduce_scatter(send, out, counts, reduce_options("reduce-scatter"));
  } else {
    out.copy_from(send);
  }
  model_.memory().add(MemoryKind::unsharded, -bytes_of(packed));
  if (job.fused) {
    job.acc->pending = out;
  } else {
    Tensor result = job.reduce_dtype == DType::f32 ? out : kernels::convert(out, DType::f32);
    kernels::divide(result, job.rs_factors.post);
    if (job.replicas == 1) {
      kernels::accumulate(shard_grads_, result, ReduceOp::sum);
    } else {
      if (!job.acc->partial.defined()) {
        job.acc->partial = Tensor::zeros(Shape{job.mine}, DType::f32);
        model_.memory().add(MemoryKind::gradients, bytes_of(job.acc->partial));
      }
      kernels::accumulate(job.acc->partial, result, ReduceOp::sum);
    }
  }
  model_.memory().add(MemoryKind::unsharded, -job.sink_bytes);
}

std::vector<std::int64_t> ShardedModule::piece_counts() const {
  const std::int64_t replicas = replicate_size();
  std::vector<std::int64_t> pieces;
  for (const std::int64_t count : layout_.counts())
    for (std::int64_t d = 0; d < replicas; ++d)
      pieces.push_back(count / replicas + (d < count % replicas ? 1 : 0));
  return pieces;
}

void ShardedModule::all_gather_pieces(const Reduction& job) {
  StepAccumulator& acc = *job.acc;
  const Tensor piece = acc.pending;
  acc.pending = Tensor();
  const std::vector<std::int64_t> pieces = piece_counts();
  const auto first = static_cast<std::ptrdiff_t>(shard_rank()) * replicate_size();
  Tensor gathered(Shape{job.mine}, job.reduce_dtype);
  replicate_lane_->comm->all_gather(
      piece, gathered,
      std::vector<std::int64_t>(pieces.begin() + first, pieces.begin() + first + replicate_size()),
      reduce_options("all-gather"));
  Tensor result =
      job.reduce_dtype == DType::f32 ? gathered : kernels::convert(gathered, DType::f32);
  kernels::divide(result, job.ar_factors.post);
  kernels::accumulate(shard_grads_, result, ReduceOp::sum);
}

void ShardedModule::finish_exact(const Reduction& job, comm::Communicator* replicate, bool round) {
  StepAccumulator& acc = *job.acc;
  if (replicate != nullptr && !round) {
    // A partial backward: the replicas' digit sums join now, rounded at the step's last.
    comm::all_reduce_binned_sums(*replicate, acc.shard.sums, "all-reduce " + job.label);
    acc.full.take(acc.shard);
    return;
  }
  if (!round) return;
  // Sums already reduced over the replicas join on one replica only.
  if (replicate == nullptr || replicate->rank() == 0) {
    acc.shard.take(acc.full);
  } else {
    acc.full.reset();
  }
  acc.shard.reserve(job.mine);
  if (model_.replica_groups_) {
    // Other jobs' sums join first: on the compute thread, in the groups' one order (finish_step).
    pending_round_ = PendingRound{job.divisor, job.mine, job.label, replicate};
    return;
  }
  round_carried({job.divisor, job.mine, job.label, replicate});
}

void ShardedModule::round_carried(const PendingRound& round) {
  StepAccumulator& acc = *accumulator_;
  Tensor rounded = Tensor::uninitialized(Shape{round.mine}, DType::f32);  // written whole below
  if (round.replicate != nullptr) {
    comm::reduce_binned_sums(*round.replicate, acc.shard.sums, round.divisor, rounded,
                             "all-reduce " + round.label, acc.replica_slice);
  } else {
    kernels::round_binned_sums(acc.shard.sums, round.divisor, rounded);
  }
  kernels::accumulate(shard_grads_, rounded, ReduceOp::sum);
  // The step's sums are rounded: no exact state is held until the next backward (a model's
  // binned sums are 28 bytes an element; kept per group, they would outweigh the rest).
  model_.memory().add(MemoryKind::gradients,
                      -kBinnedBytes * (acc.shard.sums.count() + acc.full.sums.count()));
  acc.shard.release();
  acc.full.release();
  acc.slice = kernels::BinnedSums();
  acc.replica_slice = kernels::BinnedSums();
}

void ShardedModule::join_replica_groups(comm::Communicator& groups) {
  const std::string label = "replica groups " + name_;
  if (model_.options().mode != comm::ReductionMode::exact) {
    // Each job's gradient is its share of the global batch's, divided by the whole batch.
    comm::CollectiveOptions options = reduce_options("replica groups");
    groups.all_reduce(shard_grads_, options);
    return;
  }
  if (!pending_round_) return;
  comm::all_reduce_binned_sums(groups, accumulator_->shard.sums, label);
  round_carried(*pending_round_);
  pending_round_.reset();
}

void ShardedModule::all_reduce_ordered(const Reduction& job) {
  StepAccumulator& acc = *job.acc;
  Tensor buffer;
  if (job.fused) {
    buffer = acc.pending;
    acc.pending = Tensor();
  } else {
    Tensor partial = acc.partial;
    if (job.ar_factors.pre != 1.0) kernels::divide(partial, job.ar_factors.pre);
    buffer = job.reduce_dtype == DType::f32 ? partial.clone()
                                            : kernels::convert(partial, job.reduce_dtype);
    model_.memory().add(MemoryKind::gradients, -bytes_of(acc.partial));
    acc.partial = Tensor();
  }
  replicate_lane_->comm->all_reduce(buffer, reduce_options("all-reduce"));
  Tensor result = job.reduce_dtype == DType::f32 ? buffer : kernels::convert(buffer, DType::f32);
  kernels::divide(result, job.ar_factors.post);
  kernels::accumulate(shard_grads_, result, ReduceOp::sum);
}

ShardedModel::ShardedModel(nn::Module& root, comm::MeshGroups& groups, RuntimeOptions options)
    : root_(root), groups_(groups), options_(options) {
  if (options_.prefetch < 0)
    throw InvalidArgument(fmt::format("prefetch {} is negative", options_.prefetch));
  if (comm::check_mode_from_environment()) options_.check_every_step = true;
}

ShardedModel::~ShardedModel() {
  for (auto& module : modules_)
    for (nn::Module* member : module->members())
      member->set_hooks(nullptr);
  modules_.clear();  // before the lanes their work runs on
  lanes_.clear();
  unit_lanes_.clear();
}

std::shared_ptr<ShardedModule::Lane> ShardedModel::lane(const std::vector<int>& dims, int channel,
                                                        const std::string& role) {
  auto& slot = lanes_[{dims, channel}];
  if (!slot) {
    slot = std::make_shared<ShardedModule::Lane>();
    std::int64_t ranks = 1;
    for (const int d : dims)
      ranks *= groups_.mesh().size(d);
    // On several hosts each collective runs in two levels when the links make that cheaper
    // for its size (the same choice on every rank: it depends on the call only).
    if (ranks > 1) {
      slot->comm = groups_.topology().single_level()
                       ? groups_.group(dims, {}, channel)
                       : groups_.two_level_group(dims, comm::TwoLevelChoice::by_price, {}, channel);
    }
    slot->name = fmt::format("{} [{}]", role, fmt::join(dims, ","));
  }
  return slot;
}

std::shared_ptr<ShardedModule::Lane> ShardedModel::unit_lane(const std::vector<int>& dims,
                                                             int channel, const std::string& role) {
  auto& slot = unit_lanes_[{dims, channel}];
  if (!slot) {
    slot = std::make_shared<ShardedModule::Lane>();
    slot->comm = groups_.unit_group(dims, {}, channel);
    slot->name = fmt::format("{} [{}] on this host", role, fmt::join(dims, ","));
  }
  return slot;
}

FsdpConfig ShardedModel::resolve_config(const FsdpConfig& config) const {
  const DeviceMesh& mesh = groups_.mesh();
  FsdpConfig resolved = config;
  std::vector<bool> used(static_cast<std::size_t>(mesh.ndim()), false);
  for (const auto* dims : {&resolved.replicate_mesh_dims, &resolved.shard_mesh_dims}) {
    for (const int d : *dims) {
      if (d < 0 || d >= mesh.ndim()) {
        throw InvalidArgument(
            fmt::format("mesh dim {} is out of range for mesh {}", d, mesh.to_string()));
      }
      if (used[static_cast<std::size_t>(d)]) {
        throw InvalidArgument(
            fmt::format("mesh dim {} is named twice among the shard and replicate dims", d));
      }
      used[static_cast<std::size_t>(d)] = true;
    }
  }
  if (resolved.shard_mesh_dims.empty()) {
    for (int d = 0; d < mesh.ndim(); ++d)
      if (!used[static_cast<std::size_t>(d)]) resolved.shard_mesh_dims.push_back(d);
  }
  if (resolved.shard_dim < 0)
    throw InvalidArgument(fmt::format("shard dim {} is negative", resolved.shard_dim));
  require_compute_dtype(resolved.param_dtype, "param dtype");
  require_compute_dtype(resolved.reduce_dtype, "reduce dtype");
  if (options_.mode == comm::ReductionMode::exact && resolved.reduce_dtype != DType::f32) {
    throw InvalidArgument(fmt::format(
        "exact mode reduces gradients exactly; reduce dtype {} applies to ordered and native "
        "modes only",
        dtype_name(resolved.reduce_dtype)));
  }
  return resolved;
}

ShardedModule& ShardedModel::fully_shard(nn::Module& module, const FsdpConfig& config,
                                         std::string name) {
  return fully_shard(std::vector<nn::Module*>{&module}, config, std::move(name));
}

ShardedModule& ShardedModel::fully_shard(const std::vector<nn::Module*>& members,
                                         const FsdpConfig& config, std::string name) {
  if (order_recorded_ || !forward_order_.empty())
    throw InvalidArgument("fully_shard must be called before the first forward");
  if (members.empty()) throw InvalidArgument("fully_shard of no module");
  for (const nn::Module* module : members) {
    if (by_module_.count(module) != 0) {
      throw InvalidArgument(
          fmt::format("module '{}' is already sharded", by_module_.at(module)->name()));
    }
  }
  nn::Module& module = *members.front();
  const FsdpConfig resolved = resolve_config(config);
  std::vector<nn::Parameter*> parameters;
  for (nn::Module* member : members)
    for (nn::Parameter* p : member->parameters())
      if (by_parameter_.count(p) == 0 &&
          std::find(parameters.begin(), parameters.end(), p) == parameters.end())
        parameters.push_back(p);
  if (parameters.empty()) {
    throw InvalidArgument(
        fmt::format("module {} has no parameters that are not already sharded", module.describe()));
  }
  if (name.empty()) {
    const std::string prefix = common_prefix(parameters);
    name = prefix.empty() ? module.describe() : fmt::format("{}: {}", prefix, module.describe());
  }
  modules_.push_back(std::unique_ptr<ShardedModule>(
      new ShardedModule(*this, members, parameters, resolved, std::move(name), modules_.size())));
  ShardedModule& created = *modules_.back();
  for (nn::Module* member : members) {
    by_module_[member] = &created;
    member->set_hooks(this);
  }
  for (std::size_t p = 0; p < parameters.size(); ++p)
    by_parameter_[parameters[p]] = {&created, p};
  return created;
}

ShardedModule& ShardedModel::group_of(const nn::Module& module) {
  return *by_module_.at(&module);
}

void ShardedModel::record_order(int kind, const ShardedModule& module) {
  const std::uint64_t event =
      (static_cast<std::uint64_t>(module.index_) << 2) | static_cast<std::uint64_t>(kind);
  order_events_.push_back(event);
  order_hash_ = mix64(order_hash_ ^ mix64(event + 1));
}

void ShardedModel::prefetch(const std::vector<ShardedModule*>& order, ShardedModule& current,
                            const std::optional<std::vector<ShardedModule*>>& explicit_list) {
  if (explicit_list) {
    for (ShardedModule* next : *explicit_list)
      next->unshard();
    return;
  }
  if (options_.prefetch == 0) return;
  const auto at = std::find(order.begin(), order.end(), &current);
  if (at == order.end()) return;
  for (auto next = at + 1; next != order.end() && next - at <= options_.prefetch; ++next)
    (*next)->unshard();
}

void ShardedModel::pre_forward(nn::Module& module) {
  ShardedModule& group = group_of(module);
  if (!order_recorded_ &&
      std::find(forward_order_.begin(), forward_order_.end(), &group) == forward_order_.end())
    forward_order_.push_back(&group);
  group.unshard();
  if (order_recorded_) prefetch(forward_order_, group, group.forward_prefetch_);
  wait_for(group.unshard_work_, "wait unshard " + group.name());
  group.compute_begin_ = std::chrono::steady_clock::now();
}

void ShardedModel::wait_for(const comm::Work& work, const std::string& what) {
  if (work.is_completed()) {
    work.wait();  // rethrows a failure
    return;
  }
  const auto begin = std::chrono::steady_clock::now();
  {
    const ProfileScope profile(ProfileRow::communication_wait);
    work.wait();
  }
  const auto end = std::chrono::steady_clock::now();
  wait_seconds_ += std::chrono::duration<double>(end - begin).count();
  if (tracer_.enabled()) tracer_.record(what, "wait", "compute", begin, end);
}

void ShardedModel::post_forward(nn::Module& module) {
  ShardedModule& group = group_of(module);
  if (tracer_.enabled()) {
    tracer_.record("forward " + group.name(), "compute", "compute", group.compute_begin_,
                   std::chrono::steady_clock::now());
  }
  const bool needed_next =
      order_recorded_ && !forward_order_.empty() && forward_order_.back() == &group;
  if (group.config_.reshard_after_forward && !needed_next) group.reshard();
}

void ShardedModel::pre_backward(nn::Module& module) {
  ShardedModule& group = group_of(module);
  group.unshard();
  const std::vector<ShardedModule*> backward_order(forward_order_.rbegin(), forward_order_.rend());
  prefetch(backward_order, group, group.backward_prefetch_);
  wait_for(group.unshard_work_, "wait unshard " + group.name());
  // The sink lays out the sums by the gathered parameters' shapes.
  if (!group.dense_sink_ && !group.binned_sink_) {
    std::int64_t bytes = 0;
    // A fresh sink per backward, freed once its reduction is done: no group holds a whole
    // gradient between backwards (the storage cache hands the next group of its size the same
    // memory).
    if (options_.mode == comm::ReductionMode::exact) {
      group.binned_sink_ = std::make_shared<nn::BinnedGradients>(group.parameters_);
      bytes = group.layout_.total() * kBinnedBytes;
    } else {
      group.dense_sink_ = std::make_shared<nn::DenseGradients>(group.parameters_);
      bytes = group.layout_.total() * 4;
    }
    group.sink_bytes_ = bytes;
    memory_.add(MemoryKind::unsharded, bytes);
  }
  // A group of several members collects all their backwards before it reduces.
  if (group.members_done_ == 0) std::fill(group.received_.begin(), group.received_.end(), false);
  group.compute_begin_ = std::chrono::steady_clock::now();
}

void ShardedModel::post_backward(nn::Module& module) {
  ShardedModule& group = group_of(module);
  if (tracer_.enabled()) {
    tracer_.record("backward " + group.name(), "compute", "compute", group.compute_begin_,
                   std::chrono::steady_clock::now());
  }
  if (++group.members_done_ < group.members_.size()) {
    group.reshard();  // the gradients stay in the sink for the next member's backward
    return;
  }
  group.members_done_ = 0;
  if (!group.step_started_) {
    group.step_received_ = group.received_;
    group.step_started_ = true;
  } else if (group.received_ != group.step_received_) {
    for (std::size_t p = 0; p < group.received_.size(); ++p) {
      if (group.received_[p] != group.step_received_[p]) {
        throw InvalidArgument(fmt::format(
            "parameter '{}' of {} {} a gradient in this backward but {} in the first backward of "
            "the step: the parameters that receive gradients must not change between the "
            "micro-batches of one step",
            group.parameters_[p]->name, group.name(),
            group.received_[p] ? "received" : "did not receive",
            group.step_received_[p] ? "did" : "did not"));
      }
    }
  }
  group.reshard();
  if (group.requires_gradient_sync_) group.launch_reduce();
}

nn::GradientSink& ShardedModel::sink_of(const nn::Parameter& p) {
  const auto found = by_parameter_.find(&p);
  if (found == by_parameter_.end()) {
    throw InvalidArgument(
        fmt::format("parameter '{}' received a gradient but is in no sharded group", p.name));
  }
  ShardedModule& group = *found->second.first;
  group.received_[found->second.second] = true;
  if (group.dense_sink_) return *group.dense_sink_;
  if (group.binned_sink_) return *group.binned_sink_;
  throw InvalidArgument(
      fmt::format("parameter '{}' received a gradient outside its module's backward", p.name));
}

void ShardedModel::add_outer_products(const nn::Parameter& p, const Tensor& x, const Tensor& dy) {
  sink_of(p).add_outer_products(p, x, dy);
}

void ShardedModel::add_sample_outer_products(const nn::Parameter& p, const Tensor& x,
                                             const Tensor& dy, std::int64_t sample_rows) {
  nn::SequenceSplit* split = options_.sequence_split;
  nn::GradientSink& sink = sink_of(p);
  const bool split_rows = split != nullptr && split->degree() > 1 &&
                          options_.mode == comm::ReductionMode::exact && sample_rows > 0 &&
                          sample_rows == static_cast<std::int64_t>(split->positions().size());
  if (!split_rows) {
    sink.add_sample_outer_products(p, x, dy, sample_rows);
    return;
  }
  const std::int64_t samples = x.shape()[0] / sample_rows;
  // Gathered as f32 (bf16 operands are exact in it) and handed on in the layer's dtype.
  const auto gathered = [&](const Tensor& t) {
    return split->gather(
        kernels::as_dtype(t, DType::f32).reshape(Shape{samples, sample_rows, t.shape()[1]}));
  };
  const Tensor whole_x = gathered(x);
  const Tensor whole_dy = gathered(dy);
  const std::int64_t length = split->length();
  const std::int64_t own = (samples - split->rank() + split->degree() - 1) / split->degree();
  if (own <= 0) return;
  // Sequences rank, rank + degree, ...: whole rows in position order, one product each.
  const auto owned = [&](const Tensor& whole) {
    const std::int64_t width = whole.shape()[2];
    Tensor out = Tensor::uninitialized(Shape{own * length, width}, DType::f32);
    for (std::int64_t k = 0; k < own; ++k) {
      const std::int64_t b = split->rank() + k * split->degree();
      std::copy_n(whole.values<float>().data() + b * length * width, length * width,
                  out.values<float>().data() + k * length * width);
    }
    return out;
  };
  sink.add_sample_outer_products(p, kernels::as_dtype(owned(whole_x), x.dtype()),
                                 kernels::as_dtype(owned(whole_dy), x.dtype()), length);
}

void ShardedModel::add_column_sums(const nn::Parameter& p, const Tensor& a) {
  sink_of(p).add_column_sums(p, a);
}

void ShardedModel::add_column_products(const nn::Parameter& p, const Tensor& a, const Tensor& b) {
  sink_of(p).add_column_products(p, a, b);
}

void ShardedModel::add_indexed_rows(const nn::Parameter& p, std::span<const std::int64_t> indices,
                                    const Tensor& rows) {
  sink_of(p).add_indexed_rows(p, indices, rows);
}

Tensor ShardedModel::forward(const Tensor& input) {
  return forward(root_, input);
}

Tensor ShardedModel::backward(const Tensor& grad_output, bool need_input_grad) {
  return backward(root_, grad_output, need_input_grad);
}

Tensor ShardedModel::forward(nn::Module& part, const Tensor& input) {
  return nn::run_forward(part, input);
}

Tensor ShardedModel::backward(nn::Module& part, const Tensor& grad_output, bool need_input_grad) {
  order_recorded_ = true;
  Tensor grad_input = nn::run_backward(part, grad_output, *this, need_input_grad);
  if (is_last_backward_ && end_step_in_backward_) finish_step();
  return grad_input;
}

void ShardedModel::finish_step() {
  // The order is compared before waiting for the reductions: a rank that issued them in another
  // order gets a DesyncError here instead of waiting for collectives that will never match.
  if (!order_checked_ || options_.check_every_step) check_order();
  order_checked_ = true;
  for (auto& module : modules_)
    wait_for(module->reduce_work_, "wait reduction " + module->name());
  if (replica_groups_) {
    for (auto& module : modules_)
      module->join_replica_groups(*replica_groups_);
  }
  // A group gathered now was prefetched by a forward that ran inside backward (a recomputed
  // block): its values are about to go stale under the optimizer step.
  for (auto& module : modules_) {
    module->step_started_ = false;
    if (module->is_unsharded()) module->reshard();
  }
  order_events_.clear();
  order_hash_ = 0;
}

void ShardedModel::check_order() {
  std::vector<int> dims = options_.same_model_dims;
  if (dims.empty()) {
    for (int d = 0; d < groups_.mesh().ndim(); ++d)
      dims.push_back(d);
  }
  std::int64_t members = 1;
  for (const int d : dims)
    members *= groups_.mesh().size(d);
  if (members == 1) return;
  const std::shared_ptr<comm::Communicator> control = groups_.group(dims, {}, kControlChannel);
  const int ranks = control->size();
  comm::CollectiveOptions options;
  options.label = "issue order check";
  Tensor mine = Tensor::full(Shape{1}, DType::i64, 0.0);
  mine.values<std::int64_t>()[0] = static_cast<std::int64_t>(order_hash_);
  Tensor all(Shape{ranks}, DType::i64);
  control->all_gather(mine, all, {}, options);
  const auto hashes = all.values<std::int64_t>();
  if (std::all_of(hashes.begin(), hashes.end(), [&](std::int64_t h) { return h == hashes[0]; }))
    return;
  // Someone differs: every rank takes this path, gathers the orders and names the first
  // difference.
  Tensor count = Tensor::full(Shape{1}, DType::i64, static_cast<double>(order_events_.size()));
  Tensor counts(Shape{ranks}, DType::i64);
  control->all_gather(count, counts, {}, options);
  std::vector<std::int64_t> sizes(counts.values<std::int64_t>().begin(),
                                  counts.values<std::int64_t>().end());
  std::int64_t total = 0;
  for (const std::int64_t s : sizes)
    total += s;
  Tensor events(Shape{static_cast<std::int64_t>(order_events_.size())}, DType::i64);
  for (std::size_t i = 0; i < order_events_.size(); ++i)
    events.values<std::int64_t>()[i] = static_cast<std::int64_t>(order_events_[i]);
  Tensor gathered(Shape{total}, DType::i64);
  control->all_gather(events, gathered, sizes, options);
  const auto values = gathered.values<std::int64_t>();
  const std::vector<std::int64_t> starts = comm::displacements(sizes);
  const auto describe = [&](int rank, std::int64_t i) -> std::string {
    if (i >= sizes[static_cast<std::size_t>(rank)]) return "nothing (its step ended there)";
    const auto event = static_cast<std::uint64_t>(
        values[static_cast<std::size_t>(starts[static_cast<std::size_t>(rank)] + i)]);
    const std::size_t index = event >> 2;
    const std::string module =
        index < modules_.size() ? modules_[index]->name() : fmt::format("group {}", index);
    return fmt::format("the {} of '{}'", kOrderNames.at(event & 3), module);
  };
  for (int r = 1; r < ranks; ++r) {
    if (hashes[static_cast<std::size_t>(r)] == hashes[0]) continue;
    for (std::int64_t i = 0;; ++i) {
      const std::string first = describe(0, i);
      const std::string other = describe(r, i);
      if (first != other) {
        throw DesyncError(fmt::format(
            "the ranks issued FSDP collectives in different orders: operation {} of the step is "
            "{} on world rank {} but {} on world rank {}",
            i + 1, first, control->world_ranks()[0], other,
            control->world_ranks()[static_cast<std::size_t>(r)]));
      }
    }
  }
}

void ShardedModel::set_requires_gradient_sync(bool value) {
  for (auto& module : modules_)
    module->set_requires_gradient_sync(value);
}

void ShardedModel::set_requires_all_reduce(bool value) {
  for (auto& module : modules_)
    module->set_requires_all_reduce(value);
}

void ShardedModel::set_gradient_divide_factor(std::optional<double> factor) {
  for (auto& module : modules_)
    module->set_gradient_divide_factor(factor);
}

void ShardedModel::set_replicate_group(std::shared_ptr<comm::Communicator> replicate) {
  for (auto& module : modules_)
    module->reduce_work_.wait();
  replica_groups_ = replicate && replicate->size() > 1 ? std::move(replicate) : nullptr;
}

void ShardedModel::zero_grad() {
  for (auto& module : modules_) {
    module->reduce_work_.wait();
    module->shard_grads_.fill(0.0);
  }
}

void ShardedModel::reshard() {
  for (auto& module : modules_)
    module->reshard();
}

std::vector<nn::OptimizerSlot> ShardedModel::optimizer_slots() {
  std::vector<nn::OptimizerSlot> slots;
  for (auto& module : modules_)
    for (std::size_t p = 0; p < module->parameters().size(); ++p)
      slots.push_back({module->local_shard(p), module->local_grad(p)});
  return slots;
}

void ShardedModel::unshard_all() {
  for (auto& module : modules_)
    module->unshard();
  for (auto& module : modules_)
    module->unshard_work_.wait();
}

std::vector<Tensor> ShardedModel::full_parameters() {
  unshard_all();
  std::vector<Tensor> result;
  for (nn::Parameter* p : root_.parameters())
    result.push_back(p->value.clone());
  reshard();
  return result;
}

void ShardedModel::visit_full_parameters(
    const std::function<void(std::span<nn::Parameter* const>)>& visit) {
  for (auto& module : modules_) {
    module->unshard();
    module->unshard_work_.wait();
    visit(module->parameters());
    module->reshard();
  }
}

std::uint64_t ShardedModel::full_parameters_digest(
    const std::function<Tensor(const nn::Parameter&)>& whole) {
  // nn::parameters_digest's fold, each value's digest taken while its group alone is gathered.
  std::map<const nn::Parameter*, std::uint64_t> digests;
  visit_full_parameters([&](std::span<nn::Parameter* const> group) {
    for (const nn::Parameter* p : group)
      digests[p] = whole ? whole(*p).digest() : p->value.digest();
  });
  Digest64 digest;
  for (const nn::Parameter* p : root_.parameters()) {
    digest.update(p->name);
    digest.update_u64(digests.at(p));
  }
  return digest.finish();
}

}  // namespace meshtensor::fsdp
