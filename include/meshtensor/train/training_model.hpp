#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <meshtensor/checkpoint/checkpoint.hpp>
#include <meshtensor/comm/communicator.hpp>
#include <meshtensor/comm/mesh_groups.hpp>
#include <meshtensor/cp/context_parallel.hpp>
#include <meshtensor/fsdp/sharded_model.hpp>
#include <meshtensor/kernels/binned_sum.hpp>
#include <meshtensor/mesh/spec.hpp>
#include <meshtensor/nn/loss.hpp>
#include <meshtensor/nn/optim.hpp>
#include <meshtensor/pp/pipeline.hpp>
#include <meshtensor/pp/stage.hpp>
#include <meshtensor/tp/tensor_parallel.hpp>
#include <meshtensor/train/task.hpp>
#include <meshtensor/train/trainer.hpp>

namespace meshtensor::train {

/// The mesh a training config runs on and how parameters spread over it: the mesh dims they are
/// sharded and replicated over (FSDP2's arguments) and a description ("2x2 (replicate x shard)").
struct TrainingLayout {
  DeviceMesh mesh;
  fsdp::FsdpConfig fsdp;
  std::string description;
  /// Mesh dim of tensor parallelism (-1: none).
  int tp_dim = -1;
  /// Mesh dim of the pipeline stages (-1: none).
  int pp_dim = -1;
  /// Mesh dim of context parallelism (-1: none).
  int cp_dim = -1;
};

/// The layout `config` gives a run of `ranks` ranks (its named mesh, or its strategy's).
/// InvalidArgument when the named mesh does not have `ranks` ranks or hsdp's replicas do not
/// divide them.
TrainingLayout training_layout(const TrainConfig& config, std::int64_t ranks);

/// How the loss of a run is computed: over the classes split over `tp` (null: whole), exact
/// denominators or not, and whether this rank counts the losses (one rank of each tp group).
struct LossSetup {
  tp::TensorParallel* tp = nullptr;
  std::int64_t classes = 0;
  bool exact_sums = false;
  bool counts = true;
};

/// A task's model on one rank of a training layout, as train() builds it: the mesh and its
/// groups, the tensor-parallel split, the FSDP parameter groups and the optimizer on their
/// shards. Every rank of the world builds it with the same arguments and makes the same calls;
/// what one step does with it (the loss, the data) is the caller's.
class TrainingModel {
 public:
  /// Builds the model from `seed` on `world` by `config` (strategy or mesh, sequence parallel,
  /// mode, FSDP settings, optimizer). With `with_optimizer` false no optimizer is made (a frozen
  /// model). Collective.
  TrainingModel(comm::Communicator& world, const Task& task, const TrainConfig& config,
                std::uint64_t seed, bool with_optimizer = true);

  /// The layout.
  const TrainingLayout& layout() const { return layout_; }
  /// The mesh groups (the world's communicator on the layout's mesh).
  comm::MeshGroups& groups() { return *groups_; }
  /// The whole model's module tree (parameters hold this rank's tensor-parallel blocks; with a
  /// pipeline, the parameters of other ranks' stages hold nothing).
  nn::Module& module() { return *model_; }
  /// What this rank runs: the whole model, or (a GPT) its stage chunks; the sharded runtime's
  /// root.
  nn::Module& local_module() { return *root_; }
  /// Number of scalar parameters of the whole model (every stage, unsharded).
  std::int64_t parameter_count() const { return parameter_count_; }
  /// Number of parameter tensors of the whole model.
  std::int64_t parameter_tensors() const { return static_cast<std::int64_t>(whole_shapes_.size()); }
  /// The pipeline (null without a pp mesh dim).
  pp::Pipeline* pipeline() { return pipeline_.get(); }
  /// This rank's chunk c (a GPT; one chunk without a pipeline).
  pp::StageModule& chunk(std::size_t c) { return *chunks_.at(c); }
  /// Per stage of the whole model: the units it runs ("embed, blocks.0-1").
  const std::vector<std::string>& stage_units() const { return stage_units_; }
  /// The shape of the residual stream for `rows` samples of `sequence` positions as this rank
  /// holds it between two pipeline stages ([rows, sequence or its sequence-parallel shard, dim]).
  Shape boundary_shape(std::int64_t rows, std::int64_t sequence) const;
  /// Sets the FSDP flags for a backward of chunk `chunk` with micro-batch `k` of `count`: its
  /// groups reduce on the last; the caller ends the step (sharded().end_step()).
  void prepare_chunk_backward(std::size_t chunk, std::int64_t k, std::int64_t count);
  /// The logits of `tokens` on every rank: the forward, through every pipeline stage when there
  /// is a pipeline; with context parallelism each rank computes its positions and the logits
  /// are gathered (a sequence too short to split runs whole on every rank of the group).
  /// Collective; the caller reshards.
  Tensor forward_logits(const Tensor& tokens);
  /// The logits of the rows this rank holds of `tokens` (local_batch's input): forward_logits
  /// without the gather.
  Tensor forward_local(const Tensor& tokens);
  /// The part of `batch` this rank computes: with context parallelism the positions of its cp
  /// rank (inputs and targets), otherwise the batch itself.
  Batch local_batch(const Batch& batch);
  /// The context-parallel group (null without a cp mesh dim of more than one rank).
  cp::ContextParallel* context_parallel() { return cp_.get(); }
  /// Runs chunk `chunk` forward on `input` for token windows of `sequence` positions (a stage
  /// after the first learns the sequence's length here: sequence parallelism needs it).
  Tensor forward_chunk(std::size_t chunk, const Tensor& input, std::int64_t sequence);
  /// Backward of chunk `chunk` (see forward_chunk): the gradient of its input.
  Tensor backward_chunk(std::size_t chunk, const Tensor& grad_output, std::int64_t sequence);
  /// Sets the activation bytes held now (the memory account's activations).
  void note_activations(std::int64_t bytes);
  /// The FSDP runtime.
  fsdp::ShardedModel& sharded() { return *sharded_; }
  /// The tensor-parallel group (null without a tp mesh dim).
  tp::TensorParallel* tp() { return tp_.get(); }
  /// How losses are computed on this rank.
  const LossSetup& loss() const { return loss_; }
  /// The optimizer (null when built without one).
  nn::Optimizer* optimizer() { return optimizer_.get(); }
  /// The (module, style) pairs of the tensor-parallel plan applied.
  const std::vector<std::pair<std::string, std::string>>& parallel_plan() const { return plan_; }
  /// Ranks that see different samples (dp x fsdp) and this rank's place among them.
  std::int64_t data_ranks() const { return data_ranks_; }
  std::int64_t data_rank() const { return data_rank_; }

  /// Sets the FSDP flags for micro-batch `k` of `count` in one step by `mode` (FSDP2's two
  /// controls: reduce on the last only, or reduce-scatter each and all-reduce the last).
  void prepare_micro_batch(std::int64_t k, std::int64_t count, MicroBatchMode mode);
  /// The cross-entropy of `logits` (f32 [..., classes]) against one target per row, with the
  /// losses added to `losses` (exactly) when this rank counts them.
  nn::CrossEntropyResult row_losses(const Tensor& logits, const std::vector<std::int32_t>& targets,
                                    kernels::BinnedSums& losses) const;
  /// The whole logits of `logits` (this rank's classes when split over tp).
  Tensor whole_logits(const Tensor& logits) const;
  /// Steps the optimizer with learning rate `lr`, keeping the memory account of its state.
  void optimizer_step(double lr);
  /// Scales every gradient shard by clip / norm when the global L2 norm exceeds `clip`; returns
  /// the norm. Each element counts once (first replica, the tp rank that saves it); exact mode
  /// sums the squares exactly, the others in f64 in a fixed order. Collective.
  double clip_gradients(double clip);
  /// The whole value of every parameter (module().parameters() order) on every rank, the other
  /// pipeline stages' included. Collective.
  std::vector<Tensor> whole_parameters();
  /// Digest of the whole parameters (nn::parameters_digest of the unsplit model). Collective.
  std::uint64_t full_digest();
  /// This rank's checkpoint blocks of the model (and optimizer, when there is one), named
  /// "<prefix><name>" for the model and "optimizer.<...>" for its state (see model_state()).
  std::vector<checkpoint::SaveItem> state(const std::string& prefix = "model.");

  /// The placement of parameter `p` (one of the model's) on the layout's mesh: Shard over the
  /// FSDP dims along its shard dim, Shard over tp along its split dim (tp splits first), and
  /// Replicate elsewhere; with the tensor this rank holds (its FSDP shard of its tp block).
  struct PlacedParameter {
    const nn::Parameter* parameter = nullptr;
    PlacementSpec spec = PlacementSpec(std::vector<Placement>{});
    Shape global_shape;
    Tensor local;
  };
  /// Every parameter placed, in module().parameters() order.
  std::vector<PlacedParameter> placed_parameters();

 private:
  void shard_groups();
  void explain_context_parallel();  // appends the cp choices to the parallel plan
  void build_stages(const TrainConfig& config);
  void release_other_stages();
  void find_chunk_groups();
  /// Whether this rank holds parameter i of model_->parameters() (its stage runs here).
  bool holds(std::size_t i) const { return pp_owner_.empty() || pp_owner_[i] == pp_rank_; }
  std::vector<Tensor> stage_parameters();  // whole (tp-gathered) values of root_'s parameters
  /// `local` (this rank's split of p, gathered over fsdp) whole: gathered over tp when split.
  Tensor whole_of(const nn::Parameter& p, const Tensor& local) const;

  comm::Communicator& world_;
  const Task& task_;
  TrainingLayout layout_;
  std::int64_t data_ranks_ = 1;
  std::int64_t data_rank_ = 0;
  std::unique_ptr<nn::Module> model_;
  nn::Module* root_ = nullptr;  // model_ or stage_root_ or chunks_[0]
  std::vector<std::unique_ptr<pp::StageModule>> chunks_;
  std::unique_ptr<pp::StageChunks> stage_root_;
  std::vector<std::vector<fsdp::ShardedModule*>> chunk_groups_;
  std::vector<std::string> stage_units_;
  std::shared_ptr<comm::Communicator> pp_group_;
  std::unique_ptr<pp::Pipeline> pipeline_;
  std::vector<Shape> whole_shapes_;     // of model_->parameters(), before any is released
  std::vector<std::int64_t> pp_owner_;  // per model_->parameters(): the pp rank holding it (GPT)
  std::int64_t pp_rank_ = 0;
  std::int64_t parameter_count_ = 0;
  std::int64_t activation_bytes_ = 0;
  std::unique_ptr<comm::MeshGroups> groups_;
  std::unique_ptr<tp::TensorParallel> tp_;
  std::unique_ptr<cp::ContextParallel> cp_;
  std::vector<std::pair<std::string, std::string>> plan_;
  LossSetup loss_;
  std::unique_ptr<fsdp::ShardedModel> sharded_;
  std::unique_ptr<nn::Optimizer> optimizer_;
  std::int64_t optimizer_bytes_ = 0;
  bool exact_ = false;
};

}  // namespace meshtensor::train
