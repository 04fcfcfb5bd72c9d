#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <optional>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <meshtensor/comm/binned_reduction.hpp>
#include <meshtensor/core/digest.hpp>
#include <meshtensor/core/error.hpp>
#include <meshtensor/core/profile.hpp>
#include <meshtensor/mesh/layout.hpp>
#include <meshtensor/nn/decoder.hpp>
#include <meshtensor/nn/layers.hpp>
#include <meshtensor/tp/ops.hpp>
#include <meshtensor/train/model_state.hpp>
#include <meshtensor/train/training_model.hpp>

namespace meshtensor::train {

TrainingLayout training_layout(const TrainConfig& config, std::int64_t ranks) {
  fsdp::FsdpConfig shard;
  shard.reshard_after_forward = config.reshard_after_forward;
  shard.param_dtype = config.param_dtype;
  shard.reduce_dtype = config.reduce_dtype;
  if (config.mesh) {
    if (config.mesh->size() != ranks) {
      throw InvalidArgument(fmt::format("the mesh {} has {} ranks, but the run has {}",
                                        mesh_text(config), config.mesh->size(), ranks));
    }
    // Canonical order (pp,) dp, fsdp, (cp,) tp whatever order the names came in.
    std::vector<std::string> names;
    if (has_mesh_dim(config, "pp")) names.emplace_back("pp");
    names.insert(names.end(), {"dp", "fsdp"});
    if (has_mesh_dim(config, "cp")) names.emplace_back("cp");
    names.emplace_back("tp");
    std::vector<std::int64_t> sizes;
    for (const std::string& name : names)
      sizes.push_back(mesh_dim(config, name));
    const auto dim_of = [&](const char* name) {
      const auto at = std::ranges::find(names, name);
      return at == names.end() ? -1 : static_cast<int>(at - names.begin());
    };
    // Context-parallel ranks hold the same parameters and reduce their gradients like replicas.
    shard.replicate_mesh_dims = {dim_of("dp")};
    if (dim_of("cp") >= 0) shard.replicate_mesh_dims.push_back(dim_of("cp"));
    shard.shard_mesh_dims = {dim_of("fsdp")};
    return {DeviceMesh(sizes, names),
            shard,
            mesh_text(config),
            dim_of("tp"),
            dim_of("pp"),
            dim_of("cp")};
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
  if (config.mesh) {
    const std::vector<std::int64_t> at = layout_.mesh.coordinates(world.rank());
    const std::size_t dp_dim = has_mesh_dim(config, "pp") ? 1 : 0;
    data_ranks_ = train::data_ranks(config);
    data_rank_ = at[dp_dim] * mesh_dim(config, "fsdp") + at[dp_dim + 1];
  }
  {
    // A run that starts from saved weights reads every parameter: none is drawn first, and no
    // whole gradient is made (the sharded runtime keeps its own).
    std::optional<nn::WeightsToBeLoaded> loaded_next;
    if (!config.init_dir.empty() || !config.resume_dir.empty()) loaded_next.emplace(false);
    model_ = task.make_model(seed);
  }
  // MeshGroups shares the world communicator; the caller owns it.
  groups_ = std::make_unique<comm::MeshGroups>(
      layout_.mesh, std::shared_ptr<comm::Communicator>(&world, [](comm::Communicator*) {}));
  if (layout_.tp_dim >= 0) {
    tp_ = std::make_unique<tp::TensorParallel>(groups_->group(std::vector<int>{layout_.tp_dim}),
                                               config.mode, config.sequence_parallel);
  }
  if (layout_.cp_dim >= 0 && layout_.mesh.size(layout_.cp_dim) > 1) {
    auto* decoder = dynamic_cast<nn::Decoder*>(model_.get());
    if (decoder == nullptr) {
      throw InvalidArgument(
          fmt::format("context parallelism splits sequences: cp {} needs a language model, not {}",
                      layout_.mesh.size(layout_.cp_dim), model_->describe()));
    }
    cp_ = std::make_unique<cp::ContextParallel>(groups_->group(std::vector<int>{layout_.cp_dim}));
    decoder->set_sequence_split(cp_.get());
  }
  plan_ = task.prepare_model(*model_, tp_.get(), config.mode);
  // bf16 parameters: the products multiply in bf16 too (f16 ones only round the values).
  if (config.param_dtype == DType::bf16) nn::set_compute_dtype(*model_, DType::bf16);
  if (cp_ != nullptr) explain_context_parallel();
  for (const nn::Parameter* p : model_->parameters()) {
    whole_shapes_.push_back(p->global_shape());
    parameter_count_ += whole_shapes_.back().numel();
  }
  build_stages(config);
  const bool split = tp_ != nullptr && tp_->size() > 1;
  loss_ = {split ? tp_.get() : nullptr, task.classes(), exact_ && task.exact_loss_sums(),
           (!split || tp_->rank() == 0) && (pipeline_ == nullptr || pipeline_->has_last_stage())};
  fsdp::RuntimeOptions runtime;
  runtime.mode = config.mode;
  runtime.prefetch = config.prefetch;
  runtime.sequence_split = cp_.get();
  if (layout_.pp_dim >= 0) {
    for (int d = 0; d < layout_.mesh.ndim(); ++d)
      if (d != layout_.pp_dim) runtime.same_model_dims.push_back(d);
  }
  sharded_ = std::make_unique<fsdp::ShardedModel>(*root_, *groups_, runtime);
  shard_groups();
  release_other_stages();
  find_chunk_groups();
  // The chunks end at different times: the step ends once the pipeline has sent every gradient.
  if (pipeline_ != nullptr) sharded_->set_end_step_in_backward(false);
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

namespace {

/// The pipeline stage `stage` of a decoder split into `split`'s blocks: its units by name.
std::vector<std::pair<std::string, nn::Module*>> units_of_stage(
    nn::Decoder& decoder, const std::vector<std::pair<std::int64_t, std::int64_t>>& split,
    std::size_t stage) {
  const auto children = decoder.children();  // embed, blocks.0, ..., head
  std::vector<std::pair<std::string, nn::Module*>> units;
  if (stage == 0) units.push_back(children.front());
  for (std::int64_t b = split[stage].first; b < split[stage].second; ++b)
    units.push_back(children[static_cast<std::size_t>(b) + 1]);
  if (stage + 1 == split.size()) units.push_back(children.back());
  return units;
}

/// Which of units_of_stage(.., stage) recompute their forward in backward: blocks only, all of
/// them (full) or those of even index (selective).
std::vector<bool> recomputed_units(const std::vector<std::pair<std::int64_t, std::int64_t>>& split,
                                   std::size_t stage, pp::Checkpointing kind) {
  std::vector<bool> recomputed;
  if (stage == 0) recomputed.push_back(false);  // the embedding
  for (std::int64_t b = split[stage].first; b < split[stage].second; ++b) {
    recomputed.push_back(kind == pp::Checkpointing::full ||
                         (kind == pp::Checkpointing::selective && b % 2 == 0));
  }
  if (stage + 1 == split.size()) recomputed.push_back(false);  // the head
  return recomputed;
}

std::string describe_units(const std::vector<std::pair<std::string, nn::Module*>>& units) {
  std::vector<std::string> names;
  for (const auto& unit : units)
    names.push_back(unit.first);
  return fmt::format("{}", fmt::join(names, ", "));
}

}  // namespace

/// A decoder's chunks: every rank runs the stages s with s % pp == its pp coordinate (one stage
/// without a pipeline: the whole model), each block checkpointed as the config says. Other
/// models run whole.
void TrainingModel::build_stages(const TrainConfig& config) {
  auto* decoder = dynamic_cast<nn::Decoder*>(model_.get());
  if (decoder == nullptr) {
    root_ = model_.get();
    return;
  }
  const std::int64_t ranks = layout_.pp_dim >= 0 ? layout_.mesh.size(layout_.pp_dim) : 1;
  const std::int64_t pp_rank =
      layout_.pp_dim >= 0
          ? layout_.mesh.coordinates(world_.rank())[static_cast<std::size_t>(layout_.pp_dim)]
          : 0;
  const pp::ScheduleConfig schedule{config.pipeline_schedule, ranks, virtual_stages(config),
                                    config.micro_batches};
  const auto split = pp::split_blocks(decoder->layers(), schedule.stages());
  std::map<const nn::Parameter*, std::int64_t> owner;
  for (std::size_t s = 0; s < split.size(); ++s) {
    const auto units = units_of_stage(*decoder, split, s);
    stage_units_.push_back(describe_units(units));
    for (const auto& unit : units)
      for (const nn::Parameter* p : unit.second->parameters())
        owner[p] = static_cast<std::int64_t>(s) % ranks;
    if (static_cast<std::int64_t>(s) % ranks != pp_rank) continue;
    chunks_.push_back(std::make_unique<pp::StageModule>(units, s > 0));
    chunks_.back()->set_checkpointed(recomputed_units(split, s, config.activation_checkpointing));
  }
  if (chunks_.size() == 1) {
    root_ = chunks_.front().get();
  } else {
    std::vector<pp::StageModule*> chunks;
    for (auto& chunk : chunks_)
      chunks.push_back(chunk.get());
    stage_root_ = std::make_unique<pp::StageChunks>(std::move(chunks));
    root_ = stage_root_.get();
  }
  pp_rank_ = pp_rank;
  for (const nn::Parameter* p : model_->parameters())
    pp_owner_.push_back(owner.at(p));
  if (ranks > 1) {
    pp_group_ = groups_->group(std::vector<int>{layout_.pp_dim});
    pipeline_ = std::make_unique<pp::Pipeline>(*pp_group_, schedule);
  }
}

/// With a pipeline: the parameters of the other ranks' stages hold nothing (their whole shapes
/// stay in whole_shapes_).
void TrainingModel::release_other_stages() {
  const std::vector<nn::Parameter*> all = model_->parameters();
  for (std::size_t i = 0; i < all.size(); ++i) {
    if (holds(i)) continue;
    all[i]->value = Tensor();
    all[i]->grad = Tensor();
  }
}

/// The FSDP groups of each chunk (whose flags prepare_chunk_backward sets).
void TrainingModel::find_chunk_groups() {
  for (auto& chunk : chunks_) {
    std::set<const nn::Module*> inside;
    for (const auto& [path, module] : nn::named_modules(*chunk))
      inside.insert(module);
    std::vector<fsdp::ShardedModule*> groups;
    for (const auto& group : sharded_->modules())
      if (inside.contains(&group->module())) groups.push_back(group.get());
    chunk_groups_.push_back(std::move(groups));
  }
}

Shape TrainingModel::boundary_shape(std::int64_t rows, std::int64_t sequence) const {
  const auto& decoder = dynamic_cast<const nn::Decoder&>(*model_);
  if (tp_ != nullptr && tp_->sequence_parallel() && tp_->size() > 1)
    sequence = chunk_extent(sequence, tp_->size(), tp_->rank()).size;
  return Shape{rows, sequence, decoder.dim()};
}

void TrainingModel::prepare_chunk_backward(std::size_t chunk, std::int64_t k, std::int64_t count) {
  // The chunk's groups reduce (and exact sums round) after its last micro-batch.
  sharded_->set_is_last_backward(k + 1 == count);
  for (fsdp::ShardedModule* group : chunk_groups_.at(chunk)) {
    group->set_requires_gradient_sync(k + 1 == count);
    group->set_requires_all_reduce(true);
  }
}

Tensor TrainingModel::forward_chunk(std::size_t chunk, const Tensor& input, std::int64_t sequence) {
  if (tp_ != nullptr) tp_->set_sequence_length(sequence);
  return sharded_->forward(*chunks_.at(chunk), input);
}

Tensor TrainingModel::backward_chunk(std::size_t chunk, const Tensor& grad_output,
                                     std::int64_t sequence) {
  if (tp_ != nullptr) tp_->set_sequence_length(sequence);
  return sharded_->backward(*chunks_.at(chunk), grad_output, true);
}

void TrainingModel::note_activations(std::int64_t bytes) {
  sharded_->memory().add(fsdp::MemoryKind::activations, bytes - activation_bytes_);
  activation_bytes_ = bytes;
}

/// The parameter groups: one per unit of the task; with sequence parallelism each norm first
/// gets a group of its own whose gradients reduce over the tp dim as well (each tp rank saw
/// other positions of the same samples).
void TrainingModel::shard_groups() {
  if (tp_ != nullptr && tp_->size() > 1) {
    fsdp::FsdpConfig over_tp = layout_.fsdp;
    over_tp.replicate_mesh_dims = layout_.fsdp.replicate_mesh_dims;  // the dp dim
    over_tp.replicate_mesh_dims.push_back(layout_.tp_dim);
    for (const auto& [path, module] : nn::named_modules(*root_)) {
      const std::vector<nn::Parameter*> own = module->parameters();
      const bool partial = !own.empty() && module->children().empty() &&
                           std::all_of(own.begin(), own.end(), [](const nn::Parameter* p) {
                             return p->split.partial_gradients;
                           });
      if (partial) sharded_->fully_shard(*module, over_tp, path);
    }
  }
  std::set<const nn::Module*> local;
  for (const auto& [path, module] : nn::named_modules(*root_))
    local.insert(module);
  for (const std::vector<nn::Module*>& group : task_.parameter_groups(*model_)) {
    const auto held = std::count_if(group.begin(), group.end(),
                                    [&](const nn::Module* m) { return local.contains(m); });
    if (held == static_cast<std::ptrdiff_t>(group.size())) {
      sharded_->fully_shard(group, layout_.fsdp);
    } else if (held > 0) {
      throw InvalidArgument(fmt::format(
          "the modules of one parameter group ({}, ...) are on different pipeline stages",
          group.front()->describe()));
    }
  }
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
  const ProfileScope profile(ProfileRow::optimizer);
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
  const ProfileScope profile(ProfileRow::optimizer);
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
    comm::reduce_binned_sums(world_, squares, 1, total, "gradient norm");
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
  std::vector<Tensor> values = stage_parameters();
  if (pipeline_ == nullptr) return values;
  // Every stage's parameters to every rank of the pipeline, from the rank that runs it.
  std::map<const nn::Parameter*, Tensor> mine;
  const std::vector<nn::Parameter*> local = root_->parameters();
  for (std::size_t i = 0; i < local.size(); ++i)
    mine[local[i]] = values[i];
  const std::vector<nn::Parameter*> all = model_->parameters();
  std::vector<Tensor> whole;
  comm::CollectiveOptions options;
  options.label = "whole parameters";
  for (std::size_t i = 0; i < all.size(); ++i) {
    const auto root = static_cast<int>(pp_owner_[i]);
    Tensor value = holds(i) ? mine.at(all[i]).contiguous() : Tensor(whole_shapes_[i], DType::f32);
    pp_group_->broadcast(value, root, options);
    whole.push_back(std::move(value));
  }
  return whole;
}

Tensor TrainingModel::whole_of(const nn::Parameter& p, const Tensor& local) const {
  const Shape whole = p.global_shape();
  for (int d = 0; d < whole.rank(); ++d) {
    if (whole[d] == local.shape()[d]) continue;
    return tp_->redistribute(local, whole, meshtensor::Placement::shard(d),
                             meshtensor::Placement::replicate(), p.name, "digest", "gather");
  }
  return local;
}

std::vector<Tensor> TrainingModel::stage_parameters() {
  std::vector<Tensor> values = sharded_->full_parameters();
  if (loss_.tp == nullptr) return values;
  const std::vector<nn::Parameter*> parameters = root_->parameters();
  for (std::size_t i = 0; i < parameters.size(); ++i)
    values[i] = whole_of(*parameters[i], values[i]);
  return values;
}

std::uint64_t TrainingModel::full_digest() {
  if (pipeline_ == nullptr) {
    // One whole parameter at a time, a group gathered at a time: no copy of the model is held.
    if (loss_.tp == nullptr) return sharded_->full_parameters_digest();
    return sharded_->full_parameters_digest(
        [this](const nn::Parameter& p) { return whole_of(p, p.value); });
  }
  const std::vector<nn::Parameter*> parameters = model_->parameters();
  Digest64 digest;
  const std::vector<Tensor> values = whole_parameters();
  for (std::size_t i = 0; i < parameters.size(); ++i) {
    digest.update(parameters[i]->name);
    digest.update_u64(values[i].digest());
  }
  return digest.finish();
}

std::vector<checkpoint::SaveItem> TrainingModel::state(const std::string& prefix) {
  std::vector<checkpoint::SaveItem> items =
      model_state(*sharded_, optimizer_.get(), world_.rank() == 0, prefix);
  if (pipeline_ == nullptr) return items;
  // Every rank names every tensor of the checkpoint: the other stages' parameters (and their
  // optimizer state, named as this rank's is) as empty blocks this rank neither writes nor reads.
  std::vector<std::string> states;
  if (optimizer_ != nullptr && !sharded_->modules().empty()) {
    for (const auto& [state, tensor] : optimizer_->slot_state(0))
      states.push_back(state);
  }
  const std::vector<nn::Parameter*> all = model_->parameters();
  for (std::size_t i = 0; i < all.size(); ++i) {
    if (holds(i)) continue;
    const Shape& whole = whole_shapes_[i];
    std::vector<std::int64_t> none = whole.dims();
    none[0] = 0;
    const std::vector<std::int64_t> origin(none.size(), 0);
    items.push_back({prefix + all[i]->name, whole, origin, Tensor(Shape(none), DType::f32), false});
    for (const std::string& state : states) {
      items.push_back({"optimizer." + all[i]->name + "." + state, whole, origin,
                       Tensor(Shape(none), DType::f32), false});
    }
  }
  return items;
}

void TrainingModel::explain_context_parallel() {
  const int cp = cp_->degree();
  plan_.emplace_back("sequence", fmt::format("cp {}: 2·cp = {} chunks by torch.chunk rules, rank r "
                                             "holds chunks r and {} - r (head-tail)",
                                             cp, 2 * cp, 2 * cp - 1));
  plan_.emplace_back(
      "attention",
      "all-gather of each layer's keys and values over cp (forward; again in backward, then the "
      "query side: queries, output gradients, row stats), not a ring: a row sums its keys in "
      "ascending position, so a rank needs every key before any row is done; a ring would hold "
      "the same keys and overlap only the score products");
  if (exact_) {
    plan_.emplace_back("weight gradients",
                       "exact: sequence b's product on cp rank b mod cp, its rows all-gathered, "
                       "so the bits are those of whole sequences");
  }
}

Batch TrainingModel::local_batch(const Batch& batch) {
  if (cp_ == nullptr) return batch;
  cp_->set_length(batch.input.shape()[1]);
  return {cp_->local_rows(batch.input), cp_->local_entries(batch.targets, batch.input.shape()[0])};
}

Tensor TrainingModel::forward_logits(const Tensor& tokens) {
  if (cp_ == nullptr) return forward_local(tokens);
  auto& decoder = dynamic_cast<nn::Decoder&>(*model_);
  if (!cp_->splits(tokens.shape()[1])) {
    // Whole sequences on every rank of the group, the split back in place however it ends.
    struct Whole {
      nn::Decoder& decoder;
      cp::ContextParallel* split;
      ~Whole() { decoder.set_sequence_split(split); }
    } whole{decoder, cp_.get()};
    decoder.set_sequence_split(nullptr);
    return forward_local(tokens);
  }
  cp_->set_length(tokens.shape()[1]);
  const Tensor local = forward_local(cp_->local_rows(tokens));
  return cp_->gather(local);
}

Tensor TrainingModel::forward_local(const Tensor& tokens) {
  if (pipeline_ == nullptr) return sharded_->forward(tokens);
  struct Forward : pp::StageWork {
    TrainingModel& model;
    const Tensor& tokens;
    Forward(TrainingModel& m, const Tensor& t) : model(m), tokens(t) {}
    Tensor first_input(std::int64_t) override { return tokens; }
    Shape boundary_shape(std::int64_t) override {
      return model.boundary_shape(tokens.shape()[0], tokens.shape()[1]);
    }
    Tensor forward(std::int64_t chunk, std::int64_t, const Tensor& input) override {
      return model.forward_chunk(static_cast<std::size_t>(chunk), input, tokens.shape()[1]);
    }
    Tensor loss_gradient(std::int64_t, const Tensor&) override { return {}; }
    Tensor backward(std::int64_t, std::int64_t, const Tensor&) override { return {}; }
  } work(*this, tokens);
  Tensor logits = pipeline_->forward_only(work);
  nn::ActivationStash::take(*root_);  // nothing runs backward after an evaluation
  return logits;
}

std::vector<TrainingModel::PlacedParameter> TrainingModel::placed_parameters() {
  if (pipeline_ != nullptr) {
    throw InvalidArgument(fmt::format(
        "the layout {} has pipeline stages: a weight sync needs every parameter on every "
        "pipeline rank (train without a pp mesh dim)",
        layout_.description));
  }
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
