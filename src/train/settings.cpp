#include <algorithm>
#include <array>

#include <fmt/format.h>

#include <meshtensor/comm/threads_backend.hpp>
#include <meshtensor/core/error.hpp>
#include <meshtensor/core/setting_text.hpp>
#include <meshtensor/core/shape.hpp>
#include <meshtensor/train/settings.hpp>

namespace meshtensor::train {

namespace {

constexpr std::int64_t kMaxCount = std::int64_t{1} << 40;

constexpr std::array kFields = {
    SettingField{"epochs", "whole epochs (default 8; a language model: steps instead)"},
    SettingField{"steps", "optimizer steps instead of epochs (a language model: default 600)"},
    SettingField{"batch",
                 "global batch: images, or text windows (default 256; a language model 16)"},
    SettingField{"micro_batches",
                 "pieces each rank's slice is split into, summed before one reduction (default "
                 "1; with a pp dim: 2 per pp rank)"},
    SettingField{"pipeline_schedule",
                 "with a pp mesh dim: gpipe, 1f1b (default) or interleaved-1f1b"},
    SettingField{"virtual_stages", "model chunks per pp rank for interleaved-1f1b (default 2)"},
    SettingField{"activation_checkpointing",
                 "none (default), full (every block recomputes its forward in backward) or "
                 "selective (every second block)"},
    SettingField{"optimizer", "adamw or sgd (default adamw)"},
    SettingField{"lr", "learning rate (default 1e-3)"},
    SettingField{"weight_decay", "weight decay (default 0)"},
    SettingField{"momentum", "SGD momentum (default 0.9)"},
    SettingField{"schedule", "cosine or constant (default cosine)"},
    SettingField{"warmup", "steps of linear warmup (default 0; a language model 30)"},
    SettingField{"eval_every",
                 "also evaluate and report every N steps (default: each epoch end; a language "
                 "model 50)"},
    SettingField{"mode", "gradient reduction: ordered (default), exact or native"},
    SettingField{"seed", "seed of the initial weights and the data order (default 0)"},
    SettingField{"strategy", "ddp, fsdp or hsdp (default: hsdp with `mesh`, ddp otherwise)"},
    SettingField{"mesh",
                 "hsdp mesh RxS: R replicas of S-way sharding (default 2xN/2); with `names`, the "
                 "sizes of the named dims (e.g. 2x2x2)"},
    SettingField{"names",
                 "names of the `mesh` dims: pp (pipeline stages), dp (replicate), fsdp (shard), "
                 "cp (context parallel: positions of each sequence), tp (tensor parallel), e.g. "
                 "pp,fsdp,tp or fsdp,cp"},
    SettingField{"replicas", "hsdp without `mesh`: replicas of the model (default 2)"},
    SettingField{"sequence_parallel",
                 "with a tp dim: norms and the residual stream on sequence shards", true},
    SettingField{"clip_grad_norm", "clip gradients to this global L2 norm (default 0: off)"},
    SettingField{"verify_generator",
                 "a language model: after training, generate on 1 rank and score the tokens with "
                 "this run's forward on its layout; report the largest log-probability difference",
                 true},
    SettingField{"reshard_after_forward",
                 "free gathered parameters after forward, gather again for backward (default "
                 "true)",
                 true},
    SettingField{"prefetch", "parameter groups gathered ahead of use (default 1; 0: none)"},
    SettingField{"param_dtype", "dtype parameters are gathered and computed in: f32, bf16, f16"},
    SettingField{"reduce_dtype",
                 "dtype gradients are reduced in: f32, bf16, f16 (ordered/native modes)"},
    SettingField{"micro_batch_mode",
                 "no-sync (sum locally, reduce on the last) or reduce-scatter (reduce-scatter "
                 "each, all-reduce the last)"},
    SettingField{"trace", "record every rank's events for a Chrome trace", true},
    SettingField{"save", "checkpoint root: save there at the end (and every `save_every` steps)"},
    SettingField{"save_every", "save every N steps (default: at the end)"},
    SettingField{"keep_checkpoints",
                 "keep only the newest N checkpoints under `save` (default: all)"},
    SettingField{"resume", "resume from this checkpoint (or root with LATEST), on any layout"},
    SettingField{"init",
                 "a language model: start from the weights of this checkpoint or Hugging Face "
                 "folder (hf:DIR); its model and tokenizer are the run's"},
    SettingField{"stop_after", "stop after N epochs (N steps with `steps`), as a preemption would"},
    SettingField{"seq_len",
                 "a language model: tokens of a training window (default: the model's context, "
                 "which it may not pass)"},
    SettingField{"sample", "a language model: write a sample of text at the end (default true)",
                 true},
};

/// The sizes of `mesh` AxBx..., each in [1, kMaxThreadsRanks], and their product too.
std::vector<std::int64_t> mesh_sizes(const std::string& mesh) {
  std::vector<std::int64_t> sizes;
  std::int64_t ranks = 1;
  for (std::string_view size : split(mesh, 'x')) {
    sizes.push_back(integer_setting("`mesh`", std::string(size), 1, comm::kMaxThreadsRanks));
    ranks *= sizes.back();
    if (ranks > comm::kMaxThreadsRanks)
      throw ParseError(
          fmt::format("`mesh` {} has more than {} ranks", mesh, comm::kMaxThreadsRanks));
  }
  return sizes;
}

}  // namespace

std::span<const SettingField> TrainSettings::table() {
  return kFields;
}

std::int64_t TrainSettings::mesh_ranks() const {
  if (!given("mesh")) return 0;
  std::int64_t ranks = 1;
  for (const std::int64_t size : mesh_sizes(text("mesh", "")))
    ranks *= size;
  return ranks;
}

/// Epochs or steps, the batch and the evaluation period: a language model's defaults differ.
void TrainSettings::parse_length(TrainConfig& config, bool language) const {
  if (given("steps") && given("epochs"))
    throw ParseError("`epochs` and `steps` exclude each other: give one");
  const bool by_epochs = given("epochs");
  const std::string language_steps = language ? std::to_string(LanguageDefaults::steps) : "0";
  config.steps =
      integer_setting(field_name("steps"),
                      by_epochs ? std::string("0") : text("steps", language_steps), 0, kMaxCount);
  config.epochs = integer("epochs", "8", 1, 1 << 20);
  if (given("steps") && config.steps == 0) throw ParseError("`steps` 0: give at least one step");
  config.batch =
      integer("batch", language ? std::to_string(LanguageDefaults::batch) : "256", 1, 1 << 21);
  config.eval_every = integer(
      "eval_every", language ? std::to_string(LanguageDefaults::eval_every) : "0", 0, kMaxCount);
  config.sample = flag("sample", true);
  config.verify_generator = flag("verify_generator", false);
  config.trace = flag("trace", false);
}

void TrainSettings::parse_optimizer(TrainConfig& config, bool language) const {
  config.optimizer = train::parse_optimizer(text("optimizer", "adamw"));
  config.schedule.base = real("lr", "1e-3", 0.0, 1e6);
  config.schedule.kind = nn::parse_schedule_kind(text("schedule", "cosine"));
  config.schedule.warmup_steps =
      integer("warmup", language ? std::to_string(LanguageDefaults::warmup) : "0", 0, kMaxCount);
  config.weight_decay = real("weight_decay", "0", 0.0, 1e6);
  config.momentum = real("momentum", "0.9", 0.0, 1.0);
  config.mode = comm::parse_reduction_mode(text("mode", "ordered"));
  config.seed = seed_setting(field_name("seed"), text("seed", "0"));
  config.clip_grad_norm = real("clip_grad_norm", "0", 0.0, 1e6);
}

/// The mesh by dim names, or the strategy with an hsdp mesh RxS; sequence parallelism.
void TrainSettings::parse_layout(TrainConfig& config) const {
  const std::string mesh = text("mesh", "");
  const std::string names = text("names", "");
  const std::string strategy = text("strategy", "");
  config.sequence_parallel = flag("sequence_parallel", false);
  if (given("replicas")) {
    config.replicas = integer("replicas", "0", 1, comm::kMaxThreadsRanks);
  }
  if (!names.empty()) {
    if (mesh.empty()) throw ParseError("`names` names the dims of `mesh`; give `mesh` too");
    if (!strategy.empty()) {
      throw ParseError(
          fmt::format("`names` {} gives the layout by mesh dim names; `strategy` {} does not apply",
                      names, strategy));
    }
    config.mesh = parse_named_mesh(mesh, names);
    if (config.mesh->size() > comm::kMaxThreadsRanks) {
      throw ParseError(
          fmt::format("`mesh` {} has more than {} ranks", mesh, comm::kMaxThreadsRanks));
    }
    return;
  }
  if (config.sequence_parallel)
    throw ParseError("`sequence_parallel` needs a tp mesh dim: `mesh` ... `names` ...,tp");
  config.strategy = parse_strategy(strategy.empty() ? (mesh.empty() ? "ddp" : "hsdp") : strategy);
  if (mesh.empty()) return;
  if (config.strategy != Strategy::hsdp) {
    throw ParseError(fmt::format(
        "`mesh` {} is the replicate x shard mesh of hsdp; `strategy` {} runs on a 1-D mesh of "
        "`ranks`",
        mesh, strategy));
  }
  const std::vector<std::int64_t> sizes = mesh_sizes(mesh);
  if (sizes.size() != 2) throw ParseError(fmt::format("`mesh` '{}' is not RxS (e.g. 2x4)", mesh));
  config.replicas = sizes[0];
}

/// Micro-batches (a pipeline's default: two per pp rank, 1F1B's bubble at most 1/3), pipeline
/// schedule and FSDP's options.
void TrainSettings::parse_sharding(TrainConfig& config) const {
  config.pipeline_schedule = pp::parse_schedule(text("pipeline_schedule", "1f1b"));
  // 0: the schedule's default (2 for interleaved-1f1b); an explicit value is at least 1.
  config.virtual_stages = given("virtual_stages") ? integer("virtual_stages", "", 1, 1 << 10) : 0;
  config.activation_checkpointing =
      pp::parse_checkpointing(text("activation_checkpointing", "none"));
  const std::int64_t pipeline_ranks = mesh_dim(config, "pp");
  const std::int64_t micro_default =
      pipeline_ranks > 1 ? std::min<std::int64_t>(2 * pipeline_ranks, config.batch) : 1;
  config.micro_batches = integer("micro_batches", std::to_string(micro_default), 1, 1 << 21);
  config.micro_batch_mode = parse_micro_batch_mode(text("micro_batch_mode", "no-sync"));
  config.reshard_after_forward = flag("reshard_after_forward", true);
  config.prefetch = static_cast<int>(integer("prefetch", "1", 0, 64));
  config.param_dtype = parse_dtype(text("param_dtype", "f32"));
  config.reduce_dtype = parse_dtype(text("reduce_dtype", "f32"));
  for (const auto& [name, dtype] :
       {std::pair{"param_dtype", config.param_dtype}, {"reduce_dtype", config.reduce_dtype}}) {
    if (dtype != DType::f32 && dtype != DType::bf16 && dtype != DType::f16) {
      throw ParseError(
          fmt::format("`{}` {} is not one of f32, bf16, f16", name, dtype_name(dtype)));
    }
  }
  if (config.mode == comm::ReductionMode::exact && config.reduce_dtype != DType::f32) {
    throw ParseError(fmt::format(
        "`reduce_dtype` {} with `mode` exact: exact mode reduces gradients exactly (use ordered "
        "or native)",
        dtype_name(config.reduce_dtype)));
  }
}

void TrainSettings::parse_checkpoints(TrainConfig& config) const {
  config.save_dir = text("save", "");
  config.resume_dir = text("resume", "");
  config.init_dir = text("init", "");
  config.seq_len = integer("seq_len", "0", 0, std::int64_t{1} << 20);
  config.save_every = integer("save_every", "0", 0, kMaxCount);
  config.keep_checkpoints = static_cast<int>(integer("keep_checkpoints", "0", 0, 1 << 20));
  if (config.save_dir.empty() && (config.save_every > 0 || config.keep_checkpoints > 0))
    throw ParseError("`save_every` and `keep_checkpoints` need `save` DIR");
  // `stop_after` counts what the run's length counts: steps with `steps`, else epochs.
  const std::int64_t stop_after = integer("stop_after", "0", 0, kMaxCount);
  (config.steps > 0 ? config.stop_after : config.stop_after_epochs) = stop_after;
}

TrainConfig TrainSettings::config(bool language) const {
  TrainConfig config;
  parse_length(config, language);
  parse_optimizer(config, language);
  parse_layout(config);
  parse_sharding(config);
  parse_checkpoints(config);
  return config;
}

nlohmann::json settings_json(const TrainConfig& c) {
  return {
      {"epochs", c.epochs},
      {"steps", c.steps},
      {"batch", c.batch},
      {"micro_batches", c.micro_batches},
      {"optimizer", c.optimizer == OptimizerKind::adamw ? "adamw" : "sgd"},
      {"lr", c.schedule.base},
      {"schedule", c.schedule.kind == nn::LrSchedule::Kind::cosine ? "cosine" : "constant"},
      {"warmup", c.schedule.warmup_steps},
      {"weight_decay", c.weight_decay},
      {"momentum", c.momentum},
      {"mode", comm::reduction_mode_name(c.mode)},
      {"seed", c.seed},
      {"strategy", strategy_name(c.strategy)},
      {"mesh", c.mesh ? mesh_text(c) : ""},
      {"tp_dim", has_mesh_dim(c, "tp")},
      {"replicas", c.replicas},
      {"sequence_parallel", c.sequence_parallel},
      {"clip_grad_norm", c.clip_grad_norm},
      {"verify_generator", c.verify_generator},
      {"reshard_after_forward", c.reshard_after_forward},
      {"prefetch", c.prefetch},
      {"param_dtype", dtype_name(c.param_dtype)},
      {"reduce_dtype", dtype_name(c.reduce_dtype)},
      {"micro_batch_mode",
       c.micro_batch_mode == MicroBatchMode::no_sync ? "no-sync" : "reduce-scatter"},
      {"trace", c.trace},
      {"save", c.save_dir},
      {"save_every", c.save_every},
      {"keep_checkpoints", c.keep_checkpoints},
      {"resume", c.resume_dir},
      {"init", c.init_dir},
      {"seq_len", c.seq_len},
      {"stop_after", c.stop_after},
      {"stop_after_epochs", c.stop_after_epochs},
      {"eval_every", c.eval_every},
      {"sample", c.sample},
      {"pipeline_schedule", pp::schedule_name(c.pipeline_schedule)},
      {"virtual_stages", c.virtual_stages},
      {"activation_checkpointing", pp::checkpointing_name(c.activation_checkpointing)},
  };
}

}  // namespace meshtensor::train
