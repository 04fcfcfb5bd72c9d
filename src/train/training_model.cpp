#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>

#include <fmt/format.h>

#include <meshtensor/core/digest.hpp>
#include <meshtensor/core/error.hpp>
#include <meshtensor/fsdp/reduction.hpp>
#include <meshtensor/tp/ops.hpp>
#include <meshtensor/train/model_state.hpp>
#include <meshtensor/train/training_model.hpp>

namespace meshtensor::train {

TrainingLayout training_layout(const TrainConfig& config, std::int64_t ranks) {
  fsdp::FsdpConfig shard;
  shard.reshard_after_forward = config.reshard_after_forward;
  shard.param_dtype = config.param_dtype;
  shard.reduce_dtype = config.reduce_dtype;
  if (config.mesh.given) {
    if (config.mesh.ranks() != ranks) {
      throw InvalidArgument(fmt::format("the mesh {} has {} ranks, but the run has {}",
                                        config.mesh.describe(), config.mesh.ranks(), ranks));
    }
    shard.replicate_mesh_dims = {0};
    shard.shard_mesh_dims = {1};
    return {DeviceMesh({config.mesh.dp, config.mesh.fsdp, config.mesh.tp}, {"dp", "fsdp", "tp"}),
            shard, config.mesh.describe(), 2};
  }
  switch (config.strategy) {
    case Strategy::ddp:
      shard.replicate_mesh_dims = {0};
      shard.shard_mesh_dims = {};
      return {DeviceMesh({ranks}), shard, fmt::format("{} (replicate)", ranks), -1};
    case Strategy::fsdp:
      shard.shard_mesh_dims = {0};
      return {DeviceMesh({ranks}), shard, fmt::format("{} (shard)", ranks), -1};
    case Strategy::hsdp: {
      const std::int64_t replicas = config.replicas > 0 ? config.replicas : (ranks > 1 ? 2 : 1);
      if (ranks % replicas != 0) {
        throw InvalidArgument(fmt::format(
            "hsdp: {} ranks do not split into {} replicas of equal shard groups", ranks, replicas));
      }
      shard.replicate_mesh_dims = {0};
      shard.shard_mesh_dims = {1};
      return {DeviceMesh({replicas, ranks / replicas}), shard,
              fmt::format("{}x{} (replicate x shard)", replicas, ranks / replicas), -1};
    }
  }
  throw InvalidArgument("unknown strategy");
}

TrainingModel::TrainingModel(comm::Communicator& world, const Task& task, const TrainConfig& config,
                             std::uint64_t seed, bool with_optimizer)
    : world_(world),
      task_(task),
      layout_(training_layout(config, world.size())),
      exact_(config.mode == comm::ReductionMode::exact) {
  data_ranks_ = world.size();
  data_rank_ = world.rank();
  if (config.mesh.given) {
    const std::vector<std::int64_t> at = layout_.mesh.coordinates(world.rank());
    data_ranks_ = config.mesh.data_ranks();
    data_rank_ = at[0] * config.mesh.fsdp + at[1];
  }
  model_ = task.make_model(seed);
  // MeshGroups shares the world communicator; the caller owns it.
  groups_ = std::make_unique<comm::MeshGroups>(
      layout_.mesh, std::shared_ptr<comm::Communicator>(&world, [](comm::Communicator*) {}));
  if (layout_.tp_dim >= 0) {
    tp_ = std::make_unique<tp::TensorParallel>(groups_->group(std::vector<int>{layout_.tp_dim}),
                                               config.mode, config.sequence_parallel);
  }
  plan_ = task.prepare_model(*model_, tp_.get(), config.mode);
  const bool split = tp_ != nullptr && tp_->size() > 1;
  loss_ = {split ? tp_.get() : nullptr, task.classes(), exact_ && task.exact_loss_sums(),
           !split || tp_->rank() == 0};
  fsdp::RuntimeOptions runtime;
  runtime.mode = config.mode;
  runtime.prefetch = config.prefetch;
  sharded_ = std::make_unique<fsdp::ShardedModel>(*model_, *groups_, runtime);
  shard_groups();
  if (!with_optimizer) return;
  if (config.optimizer == OptimizerKind::adamw) {
    optimizer_ = std::make_unique<nn::AdamW>(sharded_->optimizer_slots(), config.weight_decay);
  } else {
    optimizer_ = std::make_unique<nn::SGD>(sharded_->optimizer_slots(), config.momentum,
                                           config.weight_decay);
  }
  optimizer_bytes_ = optimizer_->state_bytes();
  sharded_->memory().add(fsdp::MemoryKind::optimizer_state, optimizer_bytes_);
}

/// The parameter groups: one per unit of the task; with sequence parallelism each norm first
/// gets a group of its own whose gradients reduce over the tp dim as well (each tp rank saw
/// other positions of the same samples).
void TrainingModel::shard_groups() {
  if (tp_ != nullptr && tp_->size() > 1) {
    fsdp::FsdpConfig over_tp = layout_.fsdp;
    over_tp.replicate_mesh_dims = {0, layout_.tp_dim};
    for (const auto& [path, module] : nn::named_modules(*model_)) {
      const std::vector<nn::Parameter*> own = module->parameters();
      const bool partial = !own.empty() && module->children().empty() &&
                           std::all_of(own.begin(), own.end(), [](const nn::Parameter* p) {
                             return p->split.partial_gradients;
                           });
      if (partial) sharded_->fully_shard(*module, over_tp, path);
    }
  }
  for (nn::Module* unit : task_.units(*model_))
    sharded_->fully_shard(*unit, layout_.fsdp);
}

void TrainingModel::prepare_micro_batch(std::int64_t k, std::int64_t count, MicroBatchMode mode) {
  const bool last = k + 1 == count;
  sharded_->set_is_last_backward(last);
  if (mode == MicroBatchMode::no_sync) {
    sharded_->set_requires_gradient_sync(last);
    sharded_->set_requires_all_reduce(true);
  } else {
    sharded_->set_requires_gradient_sync(true);
    sharded_->set_requires_all_reduce(last);
  }
}

nn::CrossEntropyResult TrainingModel::row_losses(const Tensor& logits,
                                                 const std::vector<std::int32_t>& targets,
                                                 kernels::BinnedSums& losses) const {
  const std::int64_t columns = logits.shape()[logits.rank() - 1];
  const auto rows = static_cast<std::int64_t>(targets.size());
  nn::CrossEntropyResult loss = tp::parallel_cross_entropy(
      logits.reshape(Shape{rows, columns}), targets, loss_.tp, loss_.classes, loss_.exact_sums);
  if (rows > 0 && loss_.counts)
    kernels::add_column_sums(losses, 0, loss.losses.reshape(Shape{rows, 1}));
  if (!loss_.counts) loss.correct = 0;
  loss.grad_logits = loss.grad_logits.reshape(logits.shape());
  return loss;
}

Tensor TrainingModel::whole_logits(const Tensor& logits) const {
  return loss_.tp != nullptr ? tp::gather_classes(*loss_.tp, logits, loss_.classes) : logits;
}

void TrainingModel::optimizer_step(double lr) {
  {
    const fsdp::Tracer::Span span(sharded_->tracer(), "optimizer step", "optimizer", "compute");
    optimizer_->step(lr);
  }
  if (optimizer_->state_bytes() != optimizer_bytes_) {  // SGD makes its buffers lazily
    sharded_->memory().add(fsdp::MemoryKind::optimizer_state,
                           optimizer_->state_bytes() - optimizer_bytes_);
    optimizer_bytes_ = optimizer_->state_bytes();
  }
}

double TrainingModel::clip_gradients(double clip) {
  const fsdp::Tracer::Span span(sharded_->tracer(), "clip gradients", "optimizer", "compute");
  kernels::BinnedSums squares(1);
  double local = 0.0;
  for (const auto& module : sharded_->modules()) {
    if (!module->is_first_replica()) continue;
    for (std::size_t p = 0; p < module->parameters().size(); ++p) {
      if (!module->parameters()[p]->split.saves) continue;
      const Tensor grad = module->local_grad(p);
      if (grad.numel() == 0) continue;
      if (exact_) {
        const Tensor column = grad.contiguous().reshape(Shape{grad.numel(), 1});
        kernels::add_column_products(squares, 0, column, column);
      } else {
        for (const float g : grad.contiguous().values<float>())
          local += static_cast<double>(g) * static_cast<double>(g);
      }
    }
  }
  Tensor total = Tensor::full(Shape{1}, DType::f64, local);
  if (exact_) {
    fsdp::reduce_binned_sums(world_, squares, 1, total, "gradient norm");
  } else {
    comm::CollectiveOptions options;
    options.op = ReduceOp::sum;
    options.mode = comm::ReductionMode::ordered;
    world_.all_reduce(total, options);
  }
  const double norm = std::sqrt(total.values<double>()[0]);
  if (norm > clip) {
    const auto scale = static_cast<float>(clip / (norm + 1e-6));
    for (const auto& module : sharded_->modules()) {
      for (std::size_t p = 0; p < module->parameters().size(); ++p)
        for (float& g : module->local_grad(p).values<float>())
          g *= scale;
    }
  }
  return norm;
}

std::vector<Tensor> TrainingModel::whole_parameters() {
  std::vector<Tensor> values = sharded_->full_parameters();
  if (loss_.tp == nullptr) return values;
  const std::vector<nn::Parameter*> parameters = model_->parameters();
  for (std::size_t i = 0; i < parameters.size(); ++i) {
    const nn::Parameter& p = *parameters[i];
    const Shape whole = p.global_shape();
    for (int d = 0; d < whole.rank(); ++d) {
      if (whole[d] == values[i].shape()[d]) continue;
      values[i] = tp_->redistribute(values[i], whole, meshtensor::Placement::shard(d),
                                    meshtensor::Placement::replicate(), p.name, "digest", "gather");
      break;
    }
  }
  return values;
}

std::uint64_t TrainingModel::full_digest() {
  if (loss_.tp == nullptr) return sharded_->full_parameters_digest();
  const std::vector<Tensor> values = whole_parameters();
  const std::vector<nn::Parameter*> parameters = model_->parameters();
  Digest64 digest;
  for (std::size_t i = 0; i < parameters.size(); ++i) {
    digest.update(parameters[i]->name);
    digest.update_u64(values[i].digest());
  }
  return digest.finish();
}

std::vector<checkpoint::SaveItem> TrainingModel::state(const std::string& prefix) {
  return model_state(*sharded_, optimizer_.get(), world_.rank() == 0, prefix);
}

std::vector<TrainingModel::PlacedParameter> TrainingModel::placed_parameters() {
  std::map<const nn::Parameter*, std::pair<fsdp::ShardedModule*, std::size_t>> owner;
  for (const auto& module : sharded_->modules())
    for (std::size_t p = 0; p < module->parameters().size(); ++p)
      owner[module->parameters()[p]] = {module.get(), p};
  std::vector<PlacedParameter> placed;
  for (const nn::Parameter* parameter : model_->parameters()) {
    const auto [module, p] = owner.at(parameter);
    // The tensor-parallel block (the parameter's value is undefined while sharded).
    const Shape block = module->layout().shape(p);
    const Shape whole =
        parameter->split.global_shape.rank() > 0 ? parameter->split.global_shape : block;
    std::vector<Placement> placements(static_cast<std::size_t>(layout_.mesh.ndim()),
                                      Placement::replicate());
    std::vector<int> levels(placements.size(), 0);
    int tp_split = -1;
    for (int d = 0; d < whole.rank(); ++d)
      if (whole[d] != block[d]) tp_split = d;
    if (tp_split >= 0)
      placements[static_cast<std::size_t>(layout_.tp_dim)] = Placement::shard(tp_split);
    const std::vector<int>& shard_dims = module->config().shard_mesh_dims;
    if (shard_dims.size() > 1 && module->shard_size() > 1) {
      throw InvalidArgument(fmt::format(
          "parameter {} is sharded over {} mesh dims at once; its placement has no spec",
          parameter->name, shard_dims.size()));
    }
    if (shard_dims.size() == 1 && module->shard_size() > 1) {
      const int fsdp_dim = module->layout().dim(p);
      placements[static_cast<std::size_t>(shard_dims[0])] = Placement::shard(fsdp_dim);
      // FSDP shards the tensor-parallel block: tp splits first (outer), fsdp inside it.
      if (fsdp_dim == tp_split) levels[static_cast<std::size_t>(shard_dims[0])] = 1;
    }
    placed.push_back({parameter, PlacementSpec(std::move(placements), std::move(levels)), whole,
                      module->local_shard(p)});
  }
  return placed;
}

}  // namespace meshtensor::train
