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

/// `meshtensor rl`'s options: the launch here, the run's settings as rl::RlSettings fields.
struct RlOptions {
  std::string ranks = "1";
  CLI::Option* ranks_option = nullptr;
  std::string generator_mesh;
  std::string generator_names;
  std::string backend = "threads";
  std::string link;
  TimeoutOption timeout;
  std::string log;
  std::string plot;
  bool json = false;
  SettingOptions settings;  // the fields of rl::RlSettings
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

rl::RlSettings rl_settings(const RlOptions& options) {
  rl::RlSettings settings;
  options.settings.apply_to(settings);
  return settings;
}

rl::RlConfig parse_rl_config(const RlOptions& options) {
  const rl::RlSettings settings = rl_settings(options);
  rl::RlConfig config = settings.config();
  config.trainer_ranks =
      mesh_or_ranks(options.ranks, options.ranks_option, settings.trainer().mesh_ranks(),
                    options.settings.value("mesh"));
  config.generator = parse_generator_layout(options, config.trainer_ranks);
  return config;
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
  const SettingOptions& given = options.settings;
  const NamedPath roots[] = {{"--save", given.value("save")}};
  const std::string data = given.given("data") ? given.value("data") : train::kDefaultTextDir;
  const bool words = !given.given("task") || given.value("task") == "words";
  const NamedPath inputs[] = {
      {"--data", words ? data : ""},
      {"--init", given.value("init")},
      {"--resume", given.value("resume")},
      {"--dictionary", given.given("dictionary") ? given.value("dictionary")
                                                 : std::string(rl::kDefaultDictionary)}};
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
  std::string given;
  for (const SettingField& field : rl::RlSettings::table()) {
    if (options.settings.given(field.name))
      given += fmt::format(" {}={}", field.name, options.settings.value(field.name));
  }
  return fmt::format("rl ranks={} generator={}{}", config.trainer_ranks,
                     config.generator.describe(), given);
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
  if (options.ranks_option->count() == 0 && !options.settings.given("mesh")) {
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
  rl::RlTask task = rl_settings(options).task();
  if (!config.init.empty()) {
    config.model = generate::model_architecture(config.init);
  }
  task = rl::tokenized_for(std::move(task), config.init);
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
  options->settings.add_all(*command, rl::RlSettings::table());
  options->ranks_option = command->add_option(
      "--ranks", options->ranks, "trainer ranks (default 1; on mpi: every rank of the job)");
  command->add_option("--generator-mesh", options->generator_mesh,
                      "generator mesh, e.g. 2x2 (default: one replica per trainer rank)");
  command->add_option("--generator-names", options->generator_names,
                      "generator mesh dims: dp (replicas) then tp (default: tp for one dim, "
                      "dp,tp for two)");
  command->add_option("--backend", options->backend, "threads (default) or mpi (under mpirun)");
  command->add_option("--link", options->link, "simulated network for threads, e.g. 20us,10");
  options->timeout.add_to(*command);
  command->add_option("--log", options->log, "CSV of every step");
  command->add_option("--plot", options->plot, "PNG of the reward curve (gnuplot)");
  add_flag(*command, "--json", options->json, "one final JSON object");
  command->callback([options] { run_rl_command(*options); });
}

}  // namespace meshtensor::cli
