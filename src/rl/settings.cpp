#include <algorithm>
#include <array>
#include <vector>

#include <fmt/format.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/nn/models.hpp>
#include <meshtensor/rl/settings.hpp>
#include <meshtensor/train/text_data.hpp>

namespace meshtensor::rl {

namespace {

constexpr std::int64_t kMaxCount = std::int64_t{1} << 30;

constexpr std::array kOwnFields = {
    SettingField{"init", "checkpoint whose model starts the policy (e.g. one `train` saved)"},
    SettingField{
        "model",
        "without `init`: fresh weights of gpt:layers=L,heads=H,dim=D,context=T or llama:..."},
    SettingField{"task",
                 "words (default: English words from openings of held-out fortunes) or "
                 "arithmetic (A+B= with two-digit numbers)"},
    SettingField{"data", "text of the words task (default Debian's fortunes)"},
    SettingField{"dictionary", "word list of the words task (default /usr/share/dict/words)"},
    SettingField{"prompt_bytes", "bytes of each fortune's opening used as a prompt (default 16)"},
    SettingField{"steps", "rollout steps (default 20)"},
    SettingField{"prompts", "prompts per step (default 8)"},
    SettingField{"samples", "completions per prompt, >= 2 (default 4)"},
    SettingField{"new_tokens", "tokens per completion (default 24)"},
    SettingField{"temperature", "sampling temperature (default 1)"},
    SettingField{"top_k", "sample among the k largest logits (0: all)"},
    SettingField{"clip_ratio", "PPO clip epsilon (default 0.2)"},
    SettingField{"kl", "k3 KL coefficient to the frozen start (default 0.05)"},
    SettingField{"ppo_epochs", "passes over each rollout batch (default 1)"},
    SettingField{"minibatches", "optimizer steps per pass (default 1)"},
    SettingField{"max_batch", "generator slots (default 32)"},
    SettingField{"stop_after", "stop after this many steps in total"},
    SettingField{"compare_naive_sync",
                 "also time a gather-on-rank-0-then-broadcast sync every step (same rank counts)",
                 true},
    SettingField{"lr", "learning rate (default 3e-4)"},
    SettingField{"warmup", "warmup updates (default 0)"},
    SettingField{"schedule", "constant (default) or cosine"},
    SettingField{"optimizer", "adamw (default) or sgd"},
    SettingField{"weight_decay", "weight decay (default 0)"},
    SettingField{"clip_grad_norm", "gradient norm clip (default 1)"},
    SettingField{"micro_batches", "micro-batches per rank (default 1)"},
    SettingField{"mode", "exact (default) or ordered"},
    SettingField{"param_dtype",
                 "f32 (default) or bf16: the trainer's and the generator's products multiply in "
                 "bf16"},
    SettingField{"seed", "seed of the prompts' order and the sampling"},
    SettingField{"strategy", "trainer: ddp, fsdp or hsdp"},
    SettingField{"mesh", "trainer mesh, e.g. 2x2 (with `names`)"},
    SettingField{"names", "trainer mesh dims: dp, fsdp, tp"},
    SettingField{"sequence_parallel", "trainer: norms and residuals on sequence shards over tp",
                 true},
    SettingField{"save", "checkpoint root: the whole RL state"},
    SettingField{"save_every", "steps between saves (0: at the end)"},
    SettingField{"keep_checkpoints", "keep the newest N"},
    SettingField{"resume", "RL checkpoint to go on from (any layouts)"},
};

}  // namespace

std::span<const SettingField> RlSettings::table() {
  return kOwnFields;
}

train::TrainSettings RlSettings::trainer() const {
  train::TrainSettings trainer;
  trainer.set_default("lr", "3e-4");
  trainer.set_default("schedule", "constant");
  trainer.set_default("mode", "exact");
  trainer.set_default("clip_grad_norm", "1");
  for (const std::string_view name : kTrainerSettingFields)
    if (given(name)) trainer.set(name, text(name, ""));
  return trainer;
}

RlConfig RlSettings::config() const {
  RlConfig config;
  config.train = trainer().config(/*language=*/false);
  if (train::mesh_dim(config.train, "pp") > 1) {
    throw ParseError(fmt::format(
        "`mesh` {} `names` {}: rl's trainer holds every parameter on every rank for the weight "
        "sync; it takes dp, fsdp and tp dims, not pp",
        text("mesh", ""), text("names", "")));
  }
  if (train::mesh_dim(config.train, "cp") > 1) {
    throw ParseError(fmt::format(
        "`mesh` {} `names` {}: rl's trainer scores whole rollouts on every rank; it takes dp, "
        "fsdp and tp dims, not cp",
        text("mesh", ""), text("names", "")));
  }
  if (config.train.mode == comm::ReductionMode::native) {
    throw ParseError(
        "`mode` native: the generator's log-probabilities would not be the trainer's; use exact "
        "(the default) or ordered");
  }
  config.train.stop_after = integer("stop_after", "0", 0, kMaxCount);
  config.init = text("init", "");
  if (given("init") && given("model")) {
    throw ParseError(fmt::format("`init` {} brings its own model; `model` {} does not apply",
                                 config.init, text("model", "")));
  }
  config.model = nn::parse_decoder_spec(text("model", "gpt"));
  config.steps = integer("steps", "20", 1, kMaxCount);
  config.prompts = integer("prompts", "8", 1, kMaxCount);
  config.samples = integer("samples", "4", 0, kMaxCount);
  config.new_tokens = integer("new_tokens", "24", 1, kMaxCount);
  config.temperature = real("temperature", "1", 0.0, 1e3);
  config.top_k = integer("top_k", "0", 0, kMaxCount);
  config.clip_ratio = real("clip_ratio", "0.2", 0.0, 1.0);
  config.kl = real("kl", "0.05", -1e6, 1e6);
  config.ppo_epochs = integer("ppo_epochs", "1", 1, kMaxCount);
  config.minibatches = integer("minibatches", "1", 1, kMaxCount);
  config.max_batch = integer("max_batch", "32", 1, 1 << 16);
  config.compare_naive_sync = flag("compare_naive_sync", false);
  return config;
}

RlTask RlSettings::task() const {
  const std::string name = text("task", "words");
  if (name != "words" && given("data"))
    throw ParseError(fmt::format("`data` is the text of the words task, not of task {}", name));
  return builtin_task(name, text("data", train::kDefaultTextDir),
                      text("dictionary", kDefaultDictionary),
                      integer("prompt_bytes", "16", 1, 1 << 16));
}

}  // namespace meshtensor::rl
