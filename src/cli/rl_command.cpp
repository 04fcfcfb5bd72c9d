#include <algorithm>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <meshtensor/checkpoint/checkpoint.hpp>
#include <meshtensor/comm/threads_backend.hpp>
#include <meshtensor/core/digest.hpp>
#include <meshtensor/core/error.hpp>
#include <meshtensor/core/memory.hpp>
#include <meshtensor/generate/load.hpp>
#include <meshtensor/mesh/parse.hpp>
#include <meshtensor/rl/grpo.hpp>
#include <meshtensor/rl/result_json.hpp>
#include <meshtensor/rl/settings.hpp>
#include <meshtensor/train/text_data.hpp>

#include "backend.hpp"
#include "commands.hpp"
#include "options.hpp"
#include "output_files.hpp"
#include "plot.hpp"
#include "setting_options.hpp"

namespace meshtensor::cli {

namespace {

constexpr std::int64_t kMaxCount = std::int64_t{1} << 30;

/// `meshtensor rl`'s options, as text until parsed into rl::RlConfig.
struct RlOptions {
  std::string init;
  std::string model;  // without --init
  std::string task = "words";
  std::string data;
  std::string dictionary = rl::kDefaultDictionary;
  std::string prompt_bytes = "16";
  std::string steps = "20";
  std::string prompts = "8";
  std::string samples = "4";
  std::string new_tokens = "24";
  std::string temperature = "1";
  std::string top_k = "0";
  std::string clip_ratio = "0.2";
  std::string kl = "0.05";
  std::string ppo_epochs = "1";
  std::string minibatches = "1";
  std::string ranks = "1";
  CLI::Option* ranks_option = nullptr;
  std::string generator_mesh;
  std::string generator_names;
  std::string max_batch = "32";
  std::string backend = "threads";
  std::string link;
  TimeoutOption timeout;
  std::string stop_after = "0";
  std::string log;
  std::string plot;
  bool json = false;
  bool compare_naive_sync = false;
  SettingOptions trainer;  // the trainer's fields of train::TrainSettings
};

/// --generator-mesh / --generator-names: dims dp and tp, dp first (either may be left out);
/// without them the generator has one replica per trainer rank.
rl::GeneratorLayout parse_generator_layout(const RlOptions& options, std::int64_t trainer_ranks) {
  if (options.generator_mesh.empty()) {
    if (!options.generator_names.empty())
      throw ParseError("--generator-names names the dims of --generator-mesh; give it too");
    return {trainer_ranks, 1};
  }
  // Without names, one dim is the tp degree (as `generate --ranks`), two are dp x tp.
  const bool one_dim = options.generator_mesh.find('x') == std::string::npos;
  const std::string names =
      options.generator_names.empty() ? (one_dim ? "tp" : "dp,tp") : options.generator_names;
  const DeviceMesh mesh = parse_mesh(options.generator_mesh, names);
  if (mesh.names() != std::vector<std::string>{"dp", "tp"} &&
      mesh.names() != std::vector<std::string>{"dp"} &&
      mesh.names() != std::vector<std::string>{"tp"}) {
    throw ParseError(fmt::format(
        "--generator-names {}: the generator's dims are dp (replicas) then tp, each at most once",
        names));
  }
  if (mesh.size() > comm::kMaxThreadsRanks) {
    throw ParseError(fmt::format("--generator-mesh {} has more than {} ranks",
                                 options.generator_mesh, comm::kMaxThreadsRanks));
  }
  const auto size_of = [&](const char* name) {
    const auto& dims = mesh.names();
    const auto at = std::find(dims.begin(), dims.end(), name);
    return at == dims.end() ? 1 : mesh.size(static_cast<int>(at - dims.begin()));
  };
  return {size_of("dp"), size_of("tp")};
}

/// The trainer's settings: train::TrainSettings with rl's defaults.
train::TrainSettings trainer_settings(const RlOptions& options) {
  train::TrainSettings settings = rl::trainer_settings();
  options.trainer.apply_to(settings);
  return settings;
}

rl::RlConfig parse_rl_config(const RlOptions& options) {
  rl::RlConfig config;
  const train::TrainSettings settings = trainer_settings(options);
  config.train = settings.config(/*language=*/false);
  train::TrainConfig& trainer = config.train;
  if (train::mesh_dim(trainer, "pp") > 1) {
    throw ParseError(fmt::format(
        "--mesh {} --names {}: rl's trainer holds every parameter on every rank for the weight "
        "sync; it takes dp, fsdp and tp dims, not pp",
        options.trainer.value("mesh"), options.trainer.value("names")));
  }
  const std::int64_t ranks = integer_setting("--ranks", options.ranks, 1, comm::kMaxThreadsRanks);
  const std::int64_t from_mesh = settings.mesh_ranks();
  if (from_mesh > 0 && options.ranks_option->count() > 0 && from_mesh != ranks) {
    throw ParseError(fmt::format("--mesh {} has {} ranks but --ranks is {}",
                                 options.trainer.value("mesh"), from_mesh, ranks));
  }
  config.trainer_ranks = from_mesh > 0 ? from_mesh : ranks;
  config.generator = parse_generator_layout(options, config.trainer_ranks);
  config.init = options.init;
  if (!options.init.empty() && !options.model.empty()) {
    throw ParseError(fmt::format("--init {} brings its own model; --model {} does not apply",
                                 options.init, options.model));
  }
  config.model = nn::parse_gpt_config(options.model.empty() ? "gpt" : options.model);
  config.steps = integer_setting("--steps", options.steps, 1, kMaxCount);
  config.prompts = integer_setting("--prompts", options.prompts, 1, kMaxCount);
  config.samples = integer_setting("--samples", options.samples, 0, kMaxCount);
  config.new_tokens = integer_setting("--new-tokens", options.new_tokens, 1, kMaxCount);
  config.temperature = real_setting("--temperature", options.temperature, 0.0, 1e3);
  config.top_k = integer_setting("--top-k", options.top_k, 0, kMaxCount);
  config.clip_ratio = real_setting("--clip-ratio", options.clip_ratio, 0.0, 1.0);
  config.kl = real_setting("--kl", options.kl, -1e6, 1e6);
  config.ppo_epochs = integer_setting("--ppo-epochs", options.ppo_epochs, 1, kMaxCount);
  config.minibatches = integer_setting("--minibatches", options.minibatches, 1, kMaxCount);
  config.max_batch = integer_setting("--max-batch", options.max_batch, 1, 1 << 16);
  if (trainer.mode == comm::ReductionMode::native) {
    throw ParseError(
        "--mode native: the generator's log-probabilities would not be the trainer's; use exact "
        "(the default) or ordered");
  }
  trainer.stop_after = integer_setting("--stop-after", options.stop_after, 0, kMaxCount);
  config.compare_naive_sync = options.compare_naive_sync;
  return config;
}

/// The task's prompts and reward, with the data they need.
rl::RlTask load_rl_task(const RlOptions& options) {
  const std::string data = options.data.empty() ? train::kDefaultTextDir : options.data;
  if (options.task != "words" && !options.data.empty())
    throw ParseError(
        fmt::format("--data is the text of the words task, not of task {}", options.task));
  return rl::builtin_task(options.task, data, options.dictionary,
                          integer_setting("--prompt-bytes", options.prompt_bytes, 1, 1 << 16));
}

std::string step_line(const rl::RlStepReport& r) {
  return fmt::format(
      "step {:>4}  reward {:.4f}  parity {}/{} identical (max diff {:.3g})  kl {:.5f}  loss "
      "{:+.4f}  generate {:.2f} s  train {:.2f} s  sync {:.4f} s ({} collectives, {})",
      r.step, r.reward_mean, r.identical, r.tokens, r.max_abs_diff, r.kl_mean, r.loss,
      r.generate_seconds, r.train_seconds, r.sync_seconds, r.sync.collectives,
      format_bytes(static_cast<double>(r.sync.bytes_per_rank)));
}

void print_samples(const char* when, const std::vector<rl::RlSample>& samples) {
  std::cout << "samples " << when << ":\n";
  for (const rl::RlSample& s : samples) {
    std::cout << fmt::format("  [{:.2f}] {}|{}\n", s.reward, train::printable_text(s.prompt),
                             train::printable_text(s.completion));
  }
}

void draw_reward_plot(OutputFile& png, const std::vector<rl::RlStepReport>& steps,
                      const std::string& title) {
  std::string data;
  for (const rl::RlStepReport& r : steps)
    data += fmt::format("{} {} {}\n", r.step, r.reward_mean, r.kl_mean);
  render_plot(png, data, [&](const std::string& data_path) {
    return fmt::format(
        "set title '{}'\nset xlabel 'step'\nset ylabel 'mean reward'\nset y2label 'KL (k3)'\n"
        "set ytics nomirror\nset y2tics\nset grid\nset key bottom right\n"
        "plot '{}' using 1:2 with linespoints title 'mean reward' axes x1y1, "
        "'' using 1:3 with lines title 'KL to the reference' axes x1y2\n",
        plot_safe(title), data_path);
  });
}

/// The files a run writes, created (as temporaries) after every input was checked.
struct RlOutputs {
  std::unique_ptr<OutputFile> log;
  std::unique_ptr<OutputFile> plot;
};

RlOutputs open_rl_outputs(const RlOptions& options, const rl::RlConfig& config) {
  const NamedPath outputs[] = {{"--log", options.log}, {"--plot", options.plot}};
  const NamedPath roots[] = {{"--save", options.trainer.value("save")}};
  const std::string data = options.data.empty() ? train::kDefaultTextDir : options.data;
  const NamedPath inputs[] = {{"--data", options.task == "words" ? data : ""},
                              {"--init", options.init},
                              {"--resume", options.trainer.value("resume")},
                              {"--dictionary", options.dictionary}};
  check_outputs_are_not_inputs(outputs, roots, inputs);
  if (!config.train.save_dir.empty()) checkpoint::check_save_root(config.train.save_dir);
  RlOutputs files;
  if (!options.log.empty()) {
    files.log = std::make_unique<OutputFile>("--log", options.log);
    files.log->stream() << "step,reward_mean,tokens,identical,max_abs_diff,kl_mean,loss,"
                           "clipped_fraction,generate_seconds,train_seconds,sync_seconds,"
                           "sync_collectives,sync_bytes_per_rank\n";
  }
  if (!options.plot.empty())
    files.plot = std::make_unique<OutputFile>("--plot", options.plot, /*binary=*/true);
  return files;
}

/// The run's settings as one text: every mpi rank must have been started with the same.
std::string canonical_command(const RlOptions& options, const rl::RlConfig& config) {
  return fmt::format(
      "rl init={} model={} task={} data={} dictionary={} prompt_bytes={} steps={} prompts={} "
      "samples={} new={} temperature={} top_k={} clip={} kl={} epochs={} minibatches={} ranks={} "
      "generator={} max_batch={} stop={} naive={} trainer={}",
      options.init, options.model, options.task, options.data, options.dictionary,
      options.prompt_bytes, config.steps, config.prompts, config.samples, config.new_tokens,
      config.temperature, config.top_k, config.clip_ratio, config.kl, config.ppo_epochs,
      config.minibatches, config.trainer_ranks, config.generator.describe(), config.max_batch,
      options.stop_after, options.compare_naive_sync, train::settings_json(config.train).dump());
}

void log_step(OutputFile& log, const rl::RlStepReport& r) {
  log.stream() << fmt::format("{},{},{},{},{},{},{},{},{},{},{},{},{}\n", r.step, r.reward_mean,
                              r.tokens, r.identical, r.max_abs_diff, r.kl_mean, r.loss,
                              r.clipped_fraction, r.generate_seconds, r.train_seconds,
                              r.sync_seconds, r.sync.collectives, r.sync.bytes_per_rank);
  log.stream().flush();
}

void print_summary(const rl::RlResult& result) {
  print_samples("before", result.before);
  print_samples("after", result.after);
  std::cout << fmt::format(
      "parity: {} of {} generated tokens with the trainer's log-probability bits (largest "
      "difference {:.3g})\n",
      result.identical, result.tokens, result.max_abs_diff);
  std::cout << fmt::format(
      "trainer {}, generator {}: weights synced in memory {}\n", result.trainer_layout,
      result.generator_layout,
      result.joint_mesh ? "on their joint mesh" : "through whole tensors (no joint mesh)");
  if (!result.checkpoints.empty()) {
    std::cout << fmt::format("saved {} checkpoint(s), the last {}\n", result.checkpoints.size(),
                             result.checkpoints.back());
  }
  std::cout << fmt::format("weights digest {} ({} parameters in {} tensors, {:.1f} s)\n",
                           digest_hex(result.weights_digest), result.parameters,
                           result.parameter_tensors, result.seconds);
}

/// On mpi (one rank per process): without --ranks or --mesh the trainer takes every rank of the
/// job, and without --generator-mesh the generator has one replica per trainer rank; then the
/// layouts must fit the job (InvalidArgument naming both counts).
void fit_to_mpi_job(const RlOptions& options, std::int64_t job_ranks, const rl::RlTask& task,
                    rl::RlConfig& config) {
  if (options.ranks_option->count() == 0 && !options.trainer.given("mesh")) {
    config.trainer_ranks = job_ranks;
    if (options.generator_mesh.empty()) config.generator = {job_ranks, 1};
  }
  if (rl::rl_world_ranks(config) != job_ranks) {
    throw InvalidArgument(fmt::format(
        "the trainer ({} rank(s)) and the generator ({}) need {} ranks; the mpi job has {}",
        rl::trainer_rank_count(config, job_ranks), config.generator.describe(),
        rl::rl_world_ranks(config), job_ranks));
  }
  rl::validate_rl_config(config, task, job_ranks);
}

void run_rl_command(const RlOptions& options) {
  rl::RlConfig config = parse_rl_config(options);
  const Backend backend = parse_backend(options.backend);
  const comm::LinkDelay link =
      options.link.empty() ? comm::LinkDelay() : comm::parse_link(options.link);
  if (!options.link.empty() && backend == Backend::mpi)
    throw ParseError("--link simulates a network on the threads backend; mpi has a real one");
  options.timeout.apply();
  const rl::RlTask task = load_rl_task(options);
  if (!config.init.empty()) {
    config.model = generate::checked_architecture(checkpoint::read_index(config.init), config.init);
  }
  const std::int64_t ranks = rl::rl_world_ranks(config);
  rl::validate_rl_config(config, task, ranks);
  RlOutputs outputs = open_rl_outputs(options, config);
  run_ranks(
      backend, ranks, canonical_command(options, config),
      [&](comm::Communicator& world) {
        const bool leader = world.rank() == 0;
        if (backend == Backend::mpi) fit_to_mpi_job(options, world.size(), task, config);
        if (leader && !options.json) {
          std::cout << fmt::format(
              "GRPO on task {} ({} prompts): {} prompts x {} samples x {} tokens a step, {} "
              "steps, mode {}, trainer on {} rank(s), generator {}, {} {} rank(s)\n",
              task.name, task.prompts.size(), config.prompts, config.samples, config.new_tokens,
              config.steps, comm::reduction_mode_name(config.train.mode), config.trainer_ranks,
              config.generator.describe(), world.size(),
              backend == Backend::threads ? "threads" : "mpi");
          std::cout.flush();
        }
        rl::RlCallbacks callbacks;
        callbacks.on_step = [&](const rl::RlStepReport& r) {
          if (!options.json) std::cout << step_line(r) << '\n' << std::flush;
          if (outputs.log) log_step(*outputs.log, r);
        };
        const rl::RlResult result = rl::run_rl(world, task, config, callbacks);
        if (!leader) return;
        if (outputs.log) outputs.log->commit();
        if (options.json) {
          std::cout << rl::result_json(result, config).dump() << '\n';
        } else {
          print_summary(result);
        }
        std::cout.flush();
        if (outputs.plot) {
          draw_reward_plot(*outputs.plot, result.steps,
                           fmt::format("meshtensor rl, task {}, mode {}", task.name,
                                       comm::reduction_mode_name(config.train.mode)));
        }
      },
      link);
}

}  // namespace

void add_rl_command(CLI::App& app) {
  auto options = std::make_shared<RlOptions>();
  CLI::App* command = app.add_subcommand(
      "rl",
      "GRPO on a GPT: the generator (its own layout) samples completions, a reward scores them, "
      "the trainer (its own layout) updates the policy; weights move between the layouts in "
      "memory by redistribute, and every token's log-probability is checked against the "
      "trainer's (exact mode: the same bits, or the run stops)");
  command->add_option("--init", options->init,
                      "checkpoint whose model starts the policy (e.g. one meshtensor train saved)");
  command->add_option("--model", options->model,
                      "without --init: fresh weights of gpt:layers=L,heads=H,dim=D,context=T");
  command->add_option("--task", options->task,
                      "words (default: English words from openings of held-out fortunes) or "
                      "arithmetic (A+B= with two-digit numbers)");
  command->add_option("--data", options->data,
                      "text of the words task (default Debian's fortunes)");
  command->add_option("--dictionary", options->dictionary,
                      "word list of the words task (default /usr/share/dict/words, wamerican)");
  command->add_option("--prompt-bytes", options->prompt_bytes,
                      "bytes of each fortune's opening used as a prompt (default 16)");
  command->add_option("--steps", options->steps, "rollout steps (default 20)");
  command->add_option("--prompts", options->prompts, "prompts per step (default 8)");
  command->add_option("--samples", options->samples, "completions per prompt, >= 2 (default 4)");
  command->add_option("--new-tokens", options->new_tokens, "tokens per completion (default 24)");
  command->add_option("--temperature", options->temperature, "sampling temperature (default 1)");
  command->add_option("--top-k", options->top_k, "sample among the k largest logits (0: all)");
  command->add_option("--clip-ratio", options->clip_ratio, "PPO clip epsilon (default 0.2)");
  command->add_option("--kl", options->kl, "k3 KL coefficient to the frozen start (default 0.05)");
  command->add_option("--ppo-epochs", options->ppo_epochs, "passes over each rollout batch");
  command->add_option("--minibatches", options->minibatches, "optimizer steps per pass");
  options->trainer.add_to(
      *command, train::TrainSettings::fields(),
      std::vector<std::string_view>(std::begin(rl::kTrainerSettingFields),
                                    std::end(rl::kTrainerSettingFields)),
      {{"lr", "learning rate (default 3e-4)"},
       {"schedule", "constant (default) or cosine"},
       {"clip_grad_norm", "gradient norm clip (default 1)"},
       {"mode", "exact (default) or ordered"},
       {"seed", "seed of the prompts' order and the sampling"},
       {"strategy", "trainer: ddp, fsdp or hsdp"},
       {"mesh", "trainer mesh, e.g. 2x2 (with `names`)"},
       {"names", "trainer mesh dims: dp, fsdp, tp"},
       {"sequence_parallel", "trainer: norms and residuals on sequence shards over tp"},
       {"save", "checkpoint root: the whole RL state"},
       {"save_every", "steps between saves (0: at the end)"},
       {"keep_checkpoints", "keep the newest N"},
       {"resume", "RL checkpoint to go on from (any layouts)"}});
  options->ranks_option = command->add_option(
      "--ranks", options->ranks, "trainer ranks (default 1; on mpi: every rank of the job)");
  command->add_option("--generator-mesh", options->generator_mesh,
                      "generator mesh, e.g. 2x2 (default: one replica per trainer rank)");
  command->add_option("--generator-names", options->generator_names,
                      "generator mesh dims: dp (replicas) then tp (default: tp for one dim, "
                      "dp,tp for two)");
  command->add_option("--max-batch", options->max_batch, "generator slots (default 32)");
  command->add_option("--backend", options->backend, "threads (default) or mpi (under mpirun)");
  command->add_option("--link", options->link, "simulated network for threads, e.g. 20us,10");
  options->timeout.add_to(*command);
  command->add_option("--stop-after", options->stop_after, "stop after this many steps in total");
  command->add_option("--log", options->log, "CSV of every step");
  command->add_option("--plot", options->plot, "PNG of the reward curve (gnuplot)");
  add_flag(*command, "--json", options->json, "one final JSON object");
  add_flag(*command, "--compare-naive-sync", options->compare_naive_sync,
           "also time a gather-on-rank-0-then-broadcast sync every step (same rank counts)");
  command->callback([options] { run_rl_command(*options); });
}

}  // namespace meshtensor::cli
