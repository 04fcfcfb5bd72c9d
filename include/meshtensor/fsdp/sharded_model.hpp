#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <meshtensor/comm/mesh_groups.hpp>
#include <meshtensor/comm/work_queue.hpp>
#include <meshtensor/fsdp/memory.hpp>
#include <meshtensor/fsdp/shard_layout.hpp>
#include <meshtensor/fsdp/trace.hpp>
#include <meshtensor/fsdp/unit_gather.hpp>
#include <meshtensor/kernels/binned_sum.hpp>
#include <meshtensor/nn/gradients.hpp>
#include <meshtensor/nn/module.hpp>
#include <meshtensor/nn/optim.hpp>

namespace meshtensor::fsdp {

/// How one group's parameters are sharded and moved (FSDP2's fully_shard arguments).
struct FsdpConfig {
  /// Mesh dims the parameters are sharded over; empty: every mesh dim not replicated over.
  std::vector<int> shard_mesh_dims;
  /// Mesh dims the shards are replicated over (HSDP); DDP: every mesh dim.
  std::vector<int> replicate_mesh_dims;
  /// Tensor dim each parameter is split along (Shard(dim)); parameters with no such dim split
  /// along dim 0.
  int shard_dim = 0;
  /// Free the gathered parameters after forward (gather again for backward), except for the group
  /// whose forward runs last, which backward needs first.
  bool reshard_after_forward = true;
  /// Dtype parameters are gathered in; compute sees their values rounded to it (then held in f32).
  DType param_dtype = DType::f32;
  /// Dtype gradients are reduced in (ordered and native modes; exact mode reduces exactly).
  DType reduce_dtype = DType::f32;
  /// HSDP on several hosts: gather each shard from a replica on this rank's host when every
  /// host holds every shard among its replicas (plan_unit_gather). The replicas hold the same
  /// bits, so the gathered parameters are those of the gather over the shard group.
  bool gather_from_host_replicas = true;
};

/// Settings of the whole runtime.
struct RuntimeOptions {
  /// The reduction mode of every gradient reduction.
  comm::ReductionMode mode = comm::ReductionMode::ordered;
  /// Implicit prefetch: groups ahead (in the recorded forward order, reversed for backward) whose
  /// all-gather is issued when a group starts; 0 turns it off.
  int prefetch = 1;
  /// Compare the issue order across ranks after every step instead of after the first only.
  /// Defaults to MESHTENSOR_CHECK_COLLECTIVES=1 (check mode).
  bool check_every_step = false;
  /// Mesh dims over which every rank runs the same modules, so their issue orders must match
  /// (empty: every dim). A pipeline leaves its pp dim out: its stages run different modules.
  std::vector<int> same_model_dims;
  /// Context parallelism (null: none): each rank holds some positions of every sequence. In
  /// exact mode a weight's per-sequence product (GradientSink::add_sample_outer_products) then
  /// needs the sequence's rows in order on one rank: they are gathered over the group and
  /// sequence b's product is formed by member b mod degree, so the gradient has the bits of a
  /// run without the split.
  nn::SequenceSplit* sequence_split = nullptr;
};

class ShardedModel;

/// Waits for an unshard (the all-gather of one group and the copy into its parameters).
class UnshardHandle {
 public:
  UnshardHandle() = default;
  /// Handle on queued work.
  explicit UnshardHandle(comm::Work work) : work_(std::move(work)) {}
  /// Blocks until the parameters are gathered; rethrows what the gather failed with.
  void wait() const { work_.wait(); }
  /// True once done.
  bool is_completed() const { return work_.is_completed(); }

 private:
  comm::Work work_;
};

/// One parameter group: the parameters of one module that fully_shard() was called on (minus
/// those of sub-modules sharded before it). Each parameter is a DTensor sharded over the shard
/// mesh dims along its shard dim and replicated over the replicate dims; the group's shards live
/// in one flat buffer, gather with one all-gather and reduce with one reduce-scatter.
class ShardedModule {
 public:
  ShardedModule(const ShardedModule&) = delete;
  ShardedModule& operator=(const ShardedModule&) = delete;
  ~ShardedModule();

  /// The group's name: the module's position and description, e.g. "0: Linear(784, 1024)".
  const std::string& name() const { return name_; }
  /// The module (the first member of a group of several).
  nn::Module& module() { return *members_.front(); }
  /// The modules whose parameters the group holds (fully_shard of several modules).
  const std::vector<nn::Module*>& members() const { return members_; }
  /// The parameters of the group (their values are the full tensors while unsharded, undefined
  /// while sharded).
  const std::vector<nn::Parameter*>& parameters() const { return parameters_; }
  /// How the parameters are cut over the shard group.
  const ShardLayout& layout() const { return layout_; }
  /// The FSDP arguments the group was made with (an empty shard_mesh_dims: every mesh dim not
  /// replicated over).
  const FsdpConfig& config() const { return config_; }
  /// Ranks in the shard group and in the replicate group.
  int shard_size() const { return layout_.ranks(); }
  /// Ranks holding the same shard.
  int replicate_size() const;
  /// This rank's position in the shard group (the chunk it holds).
  int shard_rank() const;
  /// This rank's shard of parameter p (a view into the flat shard buffer, f32).
  Tensor local_shard(std::size_t p) const;
  /// Where local_shard(p) lies in the whole parameter p.
  Layout local_block(std::size_t p) const;
  /// True on the first rank of the replicate group (position 0): of the ranks holding the same
  /// shards, the one that saves them.
  bool is_first_replica() const;
  /// This rank's gradient shard of parameter p (f32; accumulates until zero_grad()).
  Tensor local_grad(std::size_t p) const;

  /// Starts gathering the parameters on the group's own unshard queue (no-op when gathered or
  /// on the way) and returns the handle to wait on.
  UnshardHandle unshard();
  /// Frees the gathered parameters (waiting for a gather in flight first).
  void reshard();
  /// True while the gathered parameters are held (or on the way).
  bool is_unsharded() const { return gathered_; }
  /// True when the unshard gathers from the replicas on this rank's host
  /// (FsdpConfig::gather_from_host_replicas).
  bool gathers_from_host_replicas() const { return unit_gather_.has_value(); }

  /// false: backward accumulates unsharded gradient sums locally, with no communication.
  void set_requires_gradient_sync(bool value) { requires_gradient_sync_ = value; }
  /// false (HSDP): backward reduce-scatters and accumulates the shard unreduced over replicas;
  /// the all-reduce over replicas waits for a backward with true.
  void set_requires_all_reduce(bool value) { requires_all_reduce_ = value; }
  /// See FsdpConfig::reshard_after_forward.
  void set_reshard_after_forward(bool value) { config_.reshard_after_forward = value; }
  /// Gradients end divided by `factor` instead of the number of ranks reduced over (shard size
  /// times replicate size); nullopt restores the default. Exact mode needs a positive integer.
  void set_gradient_divide_factor(std::optional<double> factor);
  /// Groups to gather when this group's forward starts (replaces implicit prefetch for it).
  void set_modules_to_forward_prefetch(std::vector<ShardedModule*> modules);
  /// Groups to gather when this group's backward starts.
  void set_modules_to_backward_prefetch(std::vector<ShardedModule*> modules);

 private:
  friend class ShardedModel;
  struct Lane;
  struct StepAccumulator;
  ShardedModule(ShardedModel& model, std::vector<nn::Module*> members,
                std::vector<nn::Parameter*> parameters, const FsdpConfig& config, std::string name,
                std::size_t index);

  struct Reduction;
  /// Starts this backward's reduction on the reduce lane (and the replicate lane).
  void launch_reduce();
  /// The reduction's factors, buffers and flags; takes the gradient sinks.
  std::shared_ptr<const Reduction> plan_reduction(bool exact, bool all_reduce_now);
  comm::CollectiveOptions reduce_options(const std::string& what) const;
  void reduce_scatter_exact(const Reduction& job);
  /// Ordered: the gradient sums reduce-scattered over `lane`'s group in `counts` (this rank's
  /// part `mine` elements).
  void reduce_scatter_ordered(const Reduction& job, const Lane& lane,
                              const std::vector<std::int64_t>& counts, std::int64_t mine);
  /// The unshard's all-gather of `send` (this rank's segment) into `gathered` (rank-major).
  void gather_segments(const Tensor& send, const Tensor& gathered);
  /// Two-level HSDP: the elements each member of the group over the shard and replicate dims
  /// reduces (each shard's segment cut in replicate-size pieces, shard-major).
  std::vector<std::int64_t> piece_counts() const;
  /// Two-level HSDP: the replicas' reduced pieces all-gathered into the gradient shard.
  void all_gather_pieces(const Reduction& job);
  /// Exact: joins the replicas' sums (`replicate`, or none), and rounds once when `round`
  /// (with replica groups: leaves the rounding to join_replica_groups()).
  void finish_exact(const Reduction& job, comm::Communicator* replicate, bool round);
  /// What rounding the step's carried exact sums needs.
  struct PendingRound {
    std::int64_t divisor = 0;
    std::int64_t mine = 0;
    std::string label;
    comm::Communicator* replicate = nullptr;  // the mesh's replicas (their join rounds), or none
  };
  /// Rounds the carried exact sums into the gradient shard and frees them.
  void round_carried(const PendingRound& round);
  /// After the step's reductions (compute thread, module order): joins the other jobs' sums of
  /// this rank's shard over `groups` (exact: the binned sums, then rounds; ordered: the shard's
  /// gradient).
  void join_replica_groups(comm::Communicator& groups);
  void all_reduce_ordered(const Reduction& job);
  double divide_factor() const;

  ShardedModel& model_;
  std::vector<nn::Module*> members_;
  std::size_t members_done_ = 0;  // members whose backward ended since the group's last reduction
  std::vector<nn::Parameter*> parameters_;
  FsdpConfig config_;
  std::string name_;
  std::size_t index_;
  ShardLayout layout_;
  std::shared_ptr<Lane> unshard_lane_;
  std::shared_ptr<Lane> reduce_lane_;
  std::shared_ptr<Lane> replicate_lane_;  // null without replication
  // HSDP on several hosts: the shard and replicate dims together, shard-major (ordered
  // gradients reduce-scatter over it in two levels, then all-gather over the replicas).
  std::shared_ptr<Lane> both_lane_;
  // HSDP where each host holds every shard (plan_unit_gather): the unshard gathers from the
  // replicas on this rank's host instead of over the shard group.
  std::shared_ptr<Lane> unit_unshard_lane_;
  std::optional<UnitGather> unit_gather_;
  Tensor shard_values_;       // f32 [this rank's segment]
  Tensor shard_grads_;        // f32 [this rank's segment]
  std::vector<Tensor> full_;  // gathered parameters while unsharded
  bool gathered_ = false;
  comm::Work unshard_work_;
  comm::Work reduce_work_;  // the last reduction launched (its all-reduce when there is one)
  std::shared_ptr<nn::DenseGradients> dense_sink_;  // shared with the reduction using it
  std::shared_ptr<nn::BinnedGradients> binned_sink_;
  std::shared_ptr<StepAccumulator> accumulator_;
  std::optional<PendingRound> pending_round_;  // exact, with replica groups
  std::vector<bool> received_;                 // parameters that got a gradient this backward
  std::vector<bool> step_received_;            // ... in the first backward of the step
  bool step_started_ = false;
  bool partial_pending_ = false;  // ordered: reduce-scattered sums wait for their all-reduce
  std::int64_t sink_bytes_ = 0;
  std::chrono::steady_clock::time_point compute_begin_;
  bool requires_gradient_sync_ = true;
  bool requires_all_reduce_ = true;
  std::optional<double> divide_factor_;
  std::optional<std::vector<ShardedModule*>> forward_prefetch_;
  std::optional<std::vector<ShardedModule*>> backward_prefetch_;
};

/// The FSDP/HSDP/DDP runtime of one model: the parameter groups made by fully_shard(), the hooks
/// that gather and free them around each module's forward and backward, the per-group queues the
/// collectives run on, and the gradient reductions. Every rank of the mesh builds the same model
/// and makes the same calls.
///
/// Queues: each group of ranks gets two communicators and two queues of its own, one for
/// all-gathers (unshard) and one for reductions, so a prefetching all-gather never waits behind a
/// reduce-scatter on the same ranks nor the other way round, and work on other ranks' groups never
/// blocks either. Compute waits only on the handle of the group it is about to use.
class ShardedModel : private nn::ModuleHooks, private nn::GradientSink {
 public:
  /// The runtime for `root` (which outlives it) on the mesh of `groups`.
  ShardedModel(nn::Module& root, comm::MeshGroups& groups, RuntimeOptions options = {});
  ShardedModel(const ShardedModel&) = delete;
  ShardedModel& operator=(const ShardedModel&) = delete;
  ~ShardedModel() override;

  /// Makes `module`'s parameters (those not already in a group) one sharded group. Call it on
  /// sub-modules before their parents, before the first forward. `name` defaults to the
  /// module's description. InvalidArgument for a module already sharded, mesh dims that are out
  /// of range or overlap, or a module with no parameters left.
  ShardedModule& fully_shard(nn::Module& module, const FsdpConfig& config = {},
                             std::string name = {});
  /// One group of the parameters of several modules (FSDP2's fully_shard of a list), e.g. a
  /// token embedding and a head that reads its table: each member's forward gathers the group,
  /// and the gradients of all members' backwards are summed into one reduction, launched when
  /// the last member's backward of the micro-batch ends. Errors as for one module.
  ShardedModule& fully_shard(const std::vector<nn::Module*>& members, const FsdpConfig& config = {},
                             std::string name = {});
  /// The groups, in the order they were made.
  const std::vector<std::unique_ptr<ShardedModule>>& modules() const { return modules_; }

  /// Forward through the root with gathering, prefetch and resharding.
  Tensor forward(const Tensor& input);
  /// Backward through the root: gradients go to their groups, each group's reduction starts as
  /// soon as its module's backward ends. When is_last_backward (the default), returns once every
  /// reduction finished and the gradient shards are complete.
  Tensor backward(const Tensor& grad_output, bool need_input_grad = false);

  /// Forward through `part`, a module under the root (one pipeline chunk), as forward() does
  /// through the root.
  Tensor forward(nn::Module& part, const Tensor& input);
  /// Backward through `part` (see forward(part, ...)), as backward() does through the root.
  Tensor backward(nn::Module& part, const Tensor& grad_output, bool need_input_grad);
  /// Ends the step as a backward with set_is_last_backward(true) does: checks the issue order,
  /// waits for every reduction. For a caller (a pipeline) that must send a backward's input
  /// gradient before the step ends.
  void end_step() { finish_step(); }
  /// false: a backward with set_is_last_backward(true) rounds and reduces as the step's last but
  /// leaves the rest of the step's end to end_step() (a pipeline, whose chunks end at different
  /// times). Default true.
  void set_end_step_in_backward(bool value) { end_step_in_backward_ = value; }
  /// Whether the next backward ends the step (waits for the reductions; exact mode rounds).
  void set_is_last_backward(bool value) { is_last_backward_ = value; }
  /// Sets the flag on every group.
  void set_requires_gradient_sync(bool value);
  /// Sets the flag on every group.
  void set_requires_all_reduce(bool value);
  /// Sets the factor on every group.
  void set_gradient_divide_factor(std::optional<double> factor);
  /// Adds a replicate dimension across jobs: `replicate` joins this rank with the ranks of the
  /// same place in the other jobs (a replica group's ft::GroupCommunicator), which hold the same
  /// shards and took other samples. At the end of each step, after this job's own reductions,
  /// every group's gradient shard joins theirs in module order on the calling thread: exact
  /// mode's binned sums before they round (the bits of one job that took every sample), ordered
  /// mode's gradients as a sum in member order. The divide factor must be the whole batch's.
  /// nullptr, or one rank: none. Call between steps; waits for reductions in flight.
  void set_replicate_group(std::shared_ptr<comm::Communicator> replicate);
  /// Zeroes every gradient shard.
  void zero_grad();
  /// Frees every group's gathered parameters.
  void reshard();

  /// One optimizer slot per parameter shard (empty shards included): the optimizer steps on
  /// local shards only and its state has their size.
  std::vector<nn::OptimizerSlot> optimizer_slots();
  /// Digest of the full parameters (nn::parameters_digest of the root), one group gathered at a
  /// time; with `whole`, of whole(p) for each gathered p instead of its value (a tensor-parallel
  /// split gathered whole, say; it may run collectives, in group order on every rank).
  /// Collective.
  std::uint64_t full_parameters_digest(
      const std::function<Tensor(const nn::Parameter&)>& whole = {});
  /// The full parameters as tensors in root order (gathered, copied, freed again). Collective.
  std::vector<Tensor> full_parameters();

  /// The bytes this rank holds, by kind.
  MemoryTracker& memory() { return memory_; }
  /// The events of this rank (record them with tracer().enable()).
  Tracer& tracer() { return tracer_; }
  /// Seconds the calling (compute) thread has spent waiting for gathers and reductions: the
  /// communication it could not hide.
  double wait_seconds() const { return wait_seconds_; }
  /// Fingerprint of the issue order (unshards and reductions) of the current step so far.
  std::uint64_t order_fingerprint() const { return order_hash_; }
  /// The mesh groups.
  comm::MeshGroups& groups() { return groups_; }
  /// The runtime options.
  const RuntimeOptions& options() const { return options_; }

 private:
  friend class ShardedModule;

  void pre_forward(nn::Module& module) override;
  void post_forward(nn::Module& module) override;
  void pre_backward(nn::Module& module) override;
  void post_backward(nn::Module& module) override;
  void add_outer_products(const nn::Parameter& p, const Tensor& x, const Tensor& dy) override;
  void add_sample_outer_products(const nn::Parameter& p, const Tensor& x, const Tensor& dy,
                                 std::int64_t sample_rows) override;
  void add_column_sums(const nn::Parameter& p, const Tensor& a) override;
  void add_column_products(const nn::Parameter& p, const Tensor& a, const Tensor& b) override;
  void add_indexed_rows(const nn::Parameter& p, std::span<const std::int64_t> indices,
                        const Tensor& rows) override;

  ShardedModule& group_of(const nn::Module& module);
  nn::GradientSink& sink_of(const nn::Parameter& p);
  std::shared_ptr<ShardedModule::Lane> lane(const std::vector<int>& dims, int channel,
                                            const std::string& role);
  /// The lane of the members of group(dims) on this rank's host (MeshGroups::unit_group).
  std::shared_ptr<ShardedModule::Lane> unit_lane(const std::vector<int>& dims, int channel,
                                                 const std::string& role);
  /// `config` with its shard dims filled in (every dim not replicated over); InvalidArgument for
  /// dims out of range or named twice, a negative shard dim, or dtypes the mode does not take.
  FsdpConfig resolve_config(const FsdpConfig& config) const;
  void record_order(int kind, const ShardedModule& module);
  void prefetch(const std::vector<ShardedModule*>& order, ShardedModule& current,
                const std::optional<std::vector<ShardedModule*>>& explicit_list);
  void finish_step();
  void unshard_all();  // gathers every group and waits
  /// Runs `visit` on each group's parameters while that group alone is gathered (each holds its
  /// full value), group by group in the same order on every rank: no copy is made, and no more
  /// than one group is whole at a time. Collective.
  void visit_full_parameters(const std::function<void(std::span<nn::Parameter* const>)>& visit);
  void check_order();

  nn::Module& root_;
  comm::MeshGroups& groups_;
  RuntimeOptions options_;
  MemoryTracker memory_;
  Tracer tracer_;
  std::vector<std::unique_ptr<ShardedModule>> modules_;
  std::map<const nn::Module*, ShardedModule*> by_module_;
  std::map<const nn::Parameter*, std::pair<ShardedModule*, std::size_t>> by_parameter_;
  std::map<std::pair<std::vector<int>, int>, std::shared_ptr<ShardedModule::Lane>> lanes_;
  std::map<std::pair<std::vector<int>, int>, std::shared_ptr<ShardedModule::Lane>> unit_lanes_;
  std::shared_ptr<comm::Communicator> replica_groups_;  // set_replicate_group(), or none
  std::vector<ShardedModule*> forward_order_;           // recorded on the first forward
  bool order_recorded_ = false;
  bool recording_forward_ = false;
  bool in_backward_ = false;
  bool is_last_backward_ = true;
  bool end_step_in_backward_ = true;
  std::vector<std::uint64_t> order_events_;  // this step's issue order
  std::uint64_t order_hash_ = 0;
  bool order_checked_ = false;
  comm::Work last_reduce_scatter_;  // bounds reductions in flight to one
  double wait_seconds_ = 0.0;
  void wait_for(const comm::Work& work, const std::string& what);
};

}  // namespace meshtensor::fsdp
