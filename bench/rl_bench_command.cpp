#include <iostream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <meshtensor/core/memory.hpp>
#include <meshtensor/nn/models.hpp>

#include "bench_commands.hpp"
#include "options.hpp"
#include "rl_bench.hpp"
#include "timing.hpp"

namespace meshtensor::cli {

namespace {

struct RlBenchOptions {
  std::string ranks = "4";
  std::string link = "20us,10";
  std::string model = "gpt";
  std::string repeats = "5";
  std::string steps = "4";
  bool json = false;
};

nlohmann::json to_json(const bench::RlBenchResult& r) {
  nlohmann::json syncs = nlohmann::json::array();
  for (const bench::SyncComparison& s : r.syncs) {
    syncs.push_back({{"trainer", s.trainer},
                     {"generator", s.generator},
                     {"planner_seconds", s.planner_seconds},
                     {"naive_seconds", s.naive_seconds},
                     {"speedup", s.naive_seconds / s.planner_seconds},
                     {"planner_collectives", s.planner_collectives},
                     {"planner_bytes_per_rank", s.planner_bytes_per_rank},
                     {"naive_collectives", s.naive_collectives},
                     {"naive_bytes_per_rank", s.naive_bytes_per_rank}});
  }
  nlohmann::json steps = nlohmann::json::array();
  for (const bench::StepShare& s : r.steps) {
    steps.push_back({{"setting", s.setting},
                     {"step_seconds", s.step_seconds},
                     {"sync_seconds", s.sync_seconds},
                     {"generate_seconds", s.generate_seconds},
                     {"train_seconds", s.train_seconds},
                     {"sync_share", s.sync_seconds / s.step_seconds}});
  }
  return {{"syncs", syncs},
          {"steps", steps},
          {"rollout_batch", r.rollout_batch},
          {"rollout_tokens_per_second", r.rollout_tokens_per_second},
          {"generator_tokens_per_second", r.generator_tokens_per_second},
          {"rollout_vs_generator", r.rollout_tokens_per_second / r.generator_tokens_per_second}};
}

void print(const bench::RlBenchResult& r, const bench::RlBenchConfig& config) {
  std::cout << fmt::format(
      "weight sync, {} thread ranks, simulated link {}, model {} (median of {}):\n", config.ranks,
      config.link, nn::decoder_spec_text(config.model), config.repeats);
  for (const bench::SyncComparison& s : r.syncs) {
    std::cout << fmt::format(
        "  {:<28} -> {:<14} planner {:>8.2f} ms ({:>3} collectives, {:>9}/rank)  naive {:>8.2f} "
        "ms ({:>3}, {:>9})  naive/planner {:.2f}x\n",
        s.trainer, s.generator, s.planner_seconds * 1e3, s.planner_collectives,
        format_bytes(static_cast<double>(s.planner_bytes_per_rank)), s.naive_seconds * 1e3,
        s.naive_collectives, format_bytes(static_cast<double>(s.naive_bytes_per_rank)),
        s.naive_seconds / s.planner_seconds);
  }
  std::cout << "RL steps (words task, default settings; median over steps after the first):\n";
  for (const bench::StepShare& s : r.steps) {
    std::cout << fmt::format(
        "  {:<48} step {:.3f} s: generate {:.3f}, train {:.3f}, sync {:.5f} ({:.2f}% of the "
        "step)\n",
        s.setting, s.step_seconds, s.generate_seconds, s.train_seconds, s.sync_seconds,
        100.0 * s.sync_seconds / s.step_seconds);
  }
  std::cout << fmt::format(
      "rollouts at batch {}: {:.0f} tokens/s in the RL step, {:.0f} tokens/s from the generator "
      "alone on the same requests: {:.2f}x\n",
      r.rollout_batch, r.rollout_tokens_per_second, r.generator_tokens_per_second,
      r.rollout_tokens_per_second / r.generator_tokens_per_second);
}

}  // namespace

void add_rl_bench(CLI::App& bench) {
  auto options = std::make_shared<RlBenchOptions>();
  CLI::App* command = bench.add_subcommand(
      "rl",
      "RL weight sync by the planner against gather-on-rank-0-then-broadcast on several layout "
      "pairs (simulated link), the sync's share of an RL step, and rollout decoding against the "
      "generator alone");
  command->add_option("--ranks", options->ranks, "thread ranks of the sync comparison (default 4)");
  command->add_option("--link", options->link, "simulated link LATENCY,GBPS (default 20us,10)");
  command->add_option("--model", options->model, "the policy's GPT (default gpt)");
  command->add_option("--repeats", options->repeats, "syncs timed per pair (default 5)");
  command->add_option("--steps", options->steps, "RL steps per setting (default 4)");
  add_flag(*command, "--json", options->json, "one JSON object");
  command->callback([options] {
    bench::print_machine_line(options->json);
    bench::RlBenchConfig config;
    config.ranks = static_cast<int>(integer_setting("--ranks", options->ranks, 2, 64));
    if (config.ranks % 2 != 0) {
      throw ParseError(
          fmt::format("--ranks {}: the layouts compared need an even count", config.ranks));
    }
    config.link = options->link;
    config.model = nn::parse_decoder_spec(options->model);
    config.repeats = static_cast<int>(integer_setting("--repeats", options->repeats, 1, 1000));
    config.steps = static_cast<int>(integer_setting("--steps", options->steps, 2, 1000));
    const bench::RlBenchResult result = bench::run_rl_bench(config);
    if (options->json) {
      std::cout << to_json(result).dump() << '\n';
    } else {
      print(result, config);
    }
  });
}

}  // namespace meshtensor::cli
