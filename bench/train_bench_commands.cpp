#include <memory>
#include <sstream>

#include <fmt/format.h>

#include <meshtensor/comm/threads_backend.hpp>

#include "bench_commands.hpp"
#include "cp_bench.hpp"
#include "options.hpp"
#include "pp_bench.hpp"
#include "train_bench.hpp"
#include "train_options.hpp"

namespace meshtensor::cli {

namespace {

/// The options `bench train`, `bench fsdp` and `bench tp` share with `meshtensor train`, parsed.
/// The task outlives the benchmark run (`loaded`).
bench::TrainingBenchInput bench_input(const TrainOptions& options, LoadedTask& loaded) {
  bench::TrainingBenchInput input;
  input.config = parse_config(options);
  options.timeout.apply();
  loaded = load_task(options);
  input.task = loaded.task.get();
  input.model = options.model;
  input.json = options.json;
  return input;
}

/// "4" or "3x2" (3 ranks of 2 micro-batches each), comma-separated.
std::vector<bench::TrainLayout> parse_layouts(const std::string& text) {
  std::vector<bench::TrainLayout> layouts;
  for (const std::string& entry : list_setting("--layouts", text)) {
    const auto cross = entry.find('x');
    bench::TrainLayout layout;
    const std::string option = fmt::format("--layouts {}", entry);
    layout.ranks = integer_setting(option, entry.substr(0, cross), 1, comm::kMaxThreadsRanks);
    if (cross != std::string::npos)
      layout.micro_batches = integer_setting(option, entry.substr(cross + 1), 1, 1 << 21);
    layouts.push_back(layout);
  }
  return layouts;
}

/// The simulated link and hosts of `bench fsdp` and `bench tp` (--link, --ranks-per-host, ...).
struct LinkOptions {
  std::string link = "20us,10";
  TopologyOptions topology;
  void add_to(CLI::App& command) {
    command.add_option("--link", link, "simulated link LATENCY,GBPS (default 20us,10)");
    topology.add_to(command, /*with_link=*/false);
  }
  /// Sets the link and hosts of `config` (checked before anything is measured).
  template <class Config>
  void parse_into(Config& config, std::int64_t ranks) const {
    config.link_text = link;
    config.link = comm::parse_link(link);
    TopologyOptions with_link = topology;
    with_link.link = link;
    config.hosts = with_link.topology(ranks);
    config.placed = topology.placed();
  }
};

struct TrainBenchOptions {
  TrainOptions train;
  std::string layouts;
  std::string rounds = "3";
};

void run_train_bench(const TrainBenchOptions& options) {
  bench::TrainBenchConfig config;
  config.ranks = integer_setting("--ranks", options.train.ranks, 1, comm::kMaxThreadsRanks);
  if (!options.layouts.empty()) config.layouts = parse_layouts(options.layouts);
  config.rounds = integer_setting("--rounds", options.rounds, 1, 100);
  LoadedTask loaded;
  config.input = bench_input(options.train, loaded);
  set_exit_status(bench::run_train_bench(config));
}

struct FsdpBenchOptions {
  TrainOptions train;
  LinkOptions link;
  std::string exact_steps = "3";
  std::string hsdp_replicas = "2";
};

void run_fsdp_bench(const FsdpBenchOptions& options) {
  bench::FsdpBenchConfig config;
  config.ranks = integer_setting("--ranks", options.train.ranks, 1, comm::kMaxThreadsRanks);
  config.exact_steps = integer_setting("--exact-steps", options.exact_steps, 0, 1 << 20);
  config.hsdp_replicas = integer_setting("--hsdp-replicas", options.hsdp_replicas, 0, config.ranks);
  options.link.parse_into(config, config.ranks);
  LoadedTask loaded;
  config.input = bench_input(options.train, loaded);
  set_exit_status(bench::run_fsdp_bench(config));
}

struct TpBenchOptions {
  TrainOptions train;
  LinkOptions link;
  std::string rounds = "2";
};

void run_tp_bench(const TpBenchOptions& options) {
  bench::TpBenchConfig config;
  config.rounds = integer_setting("--rounds", options.rounds, 1, 100);
  options.link.parse_into(config, 8);
  LoadedTask loaded;
  config.input = bench_input(options.train, loaded);
  set_exit_status(bench::run_tp_bench(config));
}

struct PipelineBenchOptions {
  TrainOptions train;
  std::string stages = "4";
  std::string link = "20us,10";
  std::string rounds = "5";
  std::string checkpointing_rounds = "3";
};

void run_pp_bench(const PipelineBenchOptions& options) {
  bench::PipelineBenchConfig config;
  config.stages = integer_setting("--stages", options.stages, 2, 64);
  config.rounds = integer_setting("--rounds", options.rounds, 1, 100);
  config.checkpointing_rounds =
      integer_setting("--checkpointing-rounds", options.checkpointing_rounds, 1, 100);
  config.micro_batches_given = options.train.settings.given("micro_batches");
  config.link = options.link;
  LoadedTask loaded;
  config.input = bench_input(options.train, loaded);
  set_exit_status(bench::run_pp_bench(config));
}

struct ContextBenchOptions {
  TrainOptions train;
  std::string degrees = "2,4";
  std::string link = "20us,10";
  std::string rounds = "3";
  std::string memory_limit = "1024";
};

void run_cp_bench(const ContextBenchOptions& options) {
  bench::ContextBenchConfig config;
  config.degrees.clear();
  std::stringstream list(options.degrees);
  for (std::string item; std::getline(list, item, ',');)
    config.degrees.push_back(integer_setting("--degrees", item, 2, 64));
  config.rounds = integer_setting("--rounds", options.rounds, 1, 100);
  config.memory_limit =
      integer_setting("--memory-limit", options.memory_limit, 1, std::int64_t{1} << 30) << 20;
  config.link = options.link;
  comm::parse_link(config.link);  // checked before anything is measured
  LoadedTask loaded;
  config.input = bench_input(options.train, loaded);
  set_exit_status(bench::run_cp_bench(config));
}

}  // namespace

void add_pp_bench(CLI::App& bench) {
  auto options = std::make_shared<PipelineBenchOptions>();
  CLI::App* command = bench.add_subcommand(
      "pp",
      "Pipeline parallelism: each schedule's measured bubble against its theory on the "
      "simulated link (compute replayed from one rank's timing), real pipelined steps and each "
      "stage's activation peak, and activation checkpointing's memory and step time");
  TrainOptions& train = options->train;
  train.model = "gpt";
  add_timed_train_options(*command, train, "6");
  command->add_option("--stages", options->stages, "pp ranks (default 4)");
  train.settings.add_to(*command, train::TrainSettings::table(),
                        {"micro_batches", "pipeline_schedule", "virtual_stages", "mode"},
                        {{"micro_batches", "micro-batches a step (default 2 per pp rank)"},
                         {"pipeline_schedule", "gpipe, 1f1b (default) or interleaved-1f1b"},
                         {"virtual_stages", "chunks per rank for interleaved-1f1b (default 2)"},
                         {"mode", "ordered (default) or exact"}});
  command->add_option("--link", options->link, "simulated link LATENCY,GBPS (default 20us,10)");
  command->add_option("--rounds", options->rounds, "replayed steps timed (default 5)");
  command->add_option("--checkpointing-rounds", options->checkpointing_rounds,
                      "alternated runs of each activation checkpointing (default 3)");
  add_flag(*command, "--json", train.json, "print one JSON object");
  command->callback([options] { run_pp_bench(*options); });
}

void add_cp_bench(CLI::App& bench) {
  auto options = std::make_shared<ContextBenchOptions>();
  CLI::App* command = bench.add_subcommand(
      "cp",
      "Context parallelism: each rank's attention work and time under the head-tail and "
      "contiguous splits, training steps on each cp degree against cp 1 with and without the "
      "simulated link, activation memory per rank, and the longest context within a memory "
      "limit");
  TrainOptions& train = options->train;
  train.model = "gpt:context=2048";
  train.defaults["batch"] = "2";
  add_timed_train_options(*command, train, "4");
  train.settings.add_to(*command, train::TrainSettings::table(), {"mode"},
                        {{"mode", "ordered (default) or exact"}});
  command->add_option("--degrees", options->degrees, "cp degrees, comma-separated (default 2,4)");
  command->add_option("--link", options->link, "simulated link LATENCY,GBPS (default 20us,10)");
  command->add_option("--rounds", options->rounds, "alternated runs of each (default 3)");
  command->add_option("--memory-limit", options->memory_limit,
                      "MiB of activations per rank for the longest context (default 1024)");
  add_flag(*command, "--json", train.json, "print one JSON object");
  command->callback([options] { run_cp_bench(*options); });
}

void add_train_bench(CLI::App& bench) {
  auto options = std::make_shared<TrainBenchOptions>();
  CLI::App* command = bench.add_subcommand(
      "train",
      "Time data-parallel training in ordered and exact mode in the same run (the exact over "
      "ordered step time), and check that exact mode ends on one digest over several layouts");
  TrainOptions& train = options->train;
  add_timed_train_options(*command, train, "40");
  train.ranks_option = command->add_option(
      "--ranks", train.ranks,
      "ranks of the ordered run and of the exact run it is compared with (default 2)");
  command->add_option("--layouts", options->layouts,
                      "exact-mode layouts, e.g. 1,2,4,3x2 (ranks x micro-batches); default: "
                      "--ranks");
  train.settings.add_to(*command, train::TrainSettings::table(), {"param_dtype"},
                        {{"param_dtype",
                          "f32 (default) or bf16 (bf16 compute; f32 ordered runs alternate with "
                          "its rounds for the bf16 over f32 tokens/s)"}});
  command->add_option("--rounds", options->rounds,
                      "ordered and exact runs on --ranks, alternated, for the ratio (default 3)");
  add_flag(*command, "--json", train.json, "print one JSON object");
  command->callback([options] { run_train_bench(*options); });
}

void add_fsdp_bench(CLI::App& bench) {
  auto options = std::make_shared<FsdpBenchOptions>();
  CLI::App* command = bench.add_subcommand(
      "fsdp",
      "Exposed communication of FSDP on a simulated link with and without prefetch, FSDP against "
      "DDP step time and peak memory, and one exact digest over DDP, FSDP and HSDP layouts");
  TrainOptions& train = options->train;
  train.ranks = "8";
  add_timed_train_options(*command, train, "12");
  train.ranks_option = command->add_option("--ranks", train.ranks, "thread ranks (default 8)");
  options->link.add_to(*command);
  command->add_option("--exact-steps", options->exact_steps,
                      "steps of each exact layout run (default 3; 0 skips them)");
  command->add_option("--hsdp-replicas", options->hsdp_replicas,
                      "replicas of the hsdp layout the topology runs time (default 2; 0 or 1 "
                      "skips it; it must divide --ranks)");
  add_flag(*command, "--json", train.json, "print one JSON object");
  command->callback([options] { run_fsdp_bench(*options); });
}

void add_tp_bench(CLI::App& bench) {
  auto options = std::make_shared<TpBenchOptions>();
  CLI::App* command = bench.add_subcommand(
      "tp",
      "Tensor parallelism on a simulated link: step time of FSDP x TP (and dp x fsdp x tp with "
      "sequence parallelism) against FSDP alone on 8 thread ranks, the link time each step's "
      "collectives take and how much of it the step exposes, the tensor-parallel collectives "
      "per step, and exact against ordered TP step time");
  TrainOptions& train = options->train;
  train.model = "gpt";
  add_timed_train_options(*command, train, "6");
  options->link.add_to(*command);
  command->add_option("--rounds", options->rounds,
                      "ordered and exact tp 2 runs, alternated, for the ratio (default 2)");
  add_flag(*command, "--json", train.json, "print one JSON object");
  command->callback([options] { run_tp_bench(*options); });
}

}  // namespace meshtensor::cli
