#include <filesystem>
#include <iostream>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "bench_commands.hpp"
#include "ft_bench.hpp"
#include "options.hpp"
#include "timing.hpp"

namespace meshtensor::cli {

namespace {

struct FtBenchOptions {
  std::string model = "gpt";
  std::string batch = "16";
  std::string steps = "40";
  std::string cost_steps = "20";
  std::string repeats = "3";
  std::string groups = "3";
  std::string timeout = "10";
  bool json = false;
};

nlohmann::json to_json(const bench::FtBenchResult& r) {
  nlohmann::json failures = nlohmann::json::array();
  for (const bench::FailureFigures& f : r.failures)
    failures.push_back(
        {{"what", f.what}, {"step", f.step}, {"next_step_seconds", f.next_step_seconds}});
  nlohmann::json heals = nlohmann::json::array();
  for (const bench::HealFigures& h : r.heals) {
    heals.push_back({{"group", h.group},
                     {"first_step_seconds", h.first_step_seconds},
                     {"heal_seconds", h.heal_seconds},
                     {"healed_to", h.healed_to}});
  }
  bool same = true;
  for (const std::string& d : r.digests)
    same = same && d == r.uninterrupted_digest;
  return {{"plain_step_seconds", r.plain_step_seconds},
          {"quorum_step_seconds", r.quorum_step_seconds},
          {"quorum_cost", r.quorum_step_seconds / r.plain_step_seconds - 1.0},
          {"median_step_seconds", r.median_step_seconds},
          {"failures", failures},
          {"heals", heals},
          {"digests", r.digests},
          {"uninterrupted_digest", r.uninterrupted_digest},
          {"digests_equal", same}};
}

void print(const bench::FtBenchResult& r, const bench::FtBenchConfig& config) {
  std::cout << fmt::format(
      "quorum cost, {} on 1 rank, mode exact, batch {} (median step after 2 of {}, {} runs "
      "each, alternated):\n  without a coordinator {:.4f} s, as 1 replica group {:.4f} s: the "
      "quorum costs {:+.2f}% of a step\n",
      config.model, config.batch, config.cost_steps, config.repeats, r.plain_step_seconds,
      r.quorum_step_seconds, 100.0 * (r.quorum_step_seconds / r.plain_step_seconds - 1.0));
  std::cout << fmt::format(
      "failures, {} groups of 1 rank, {} steps, --replica-timeout {} (median step {:.3f} s):\n",
      config.groups, config.steps, config.timeout, r.median_step_seconds);
  for (const bench::FailureFigures& f : r.failures) {
    std::cout << fmt::format("  {} at step {}: the survivors' next step completed {:.2f} s later\n",
                             f.what, f.step, f.next_step_seconds);
  }
  for (const bench::HealFigures& h : r.heals) {
    std::cout << fmt::format(
        "  group {} restarted: its first step completed {:.2f} s after its start (the state "
        "received and restored in {:.3f} s, to step {})\n",
        h.group, h.first_step_seconds, h.heal_seconds, h.healed_to);
  }
  bool same = true;
  for (const std::string& d : r.digests)
    same = same && d == r.uninterrupted_digest;
  std::cout << fmt::format("weights digests {}: {} the uninterrupted run's {}\n",
                           fmt::join(r.digests, ", "), same ? "all equal to" : "NOT all equal to",
                           r.uninterrupted_digest);
}

}  // namespace

void add_ft_bench(CLI::App& bench) {
  auto options = std::make_shared<FtBenchOptions>();
  CLI::App* command = bench.add_subcommand(
      "ft",
      "Fault-tolerant training: the quorum's cost of a step, the time from a group's failure "
      "(SIGKILL, SIGSTOP) to the survivors' next step, and a restarted group's time to heal");
  command->add_option("--model", options->model, "the groups' model (default gpt)");
  command->add_option("--batch", options->batch, "global batch (default 16)");
  command->add_option("--steps", options->steps, "steps of the failure run (default 40)");
  command->add_option("--cost-steps", options->cost_steps, "steps of each cost run (default 20)");
  command->add_option("--repeats", options->repeats, "cost runs each way (default 3)");
  command->add_option("--groups", options->groups, "groups of the failure run (default 3)");
  command->add_option("--timeout", options->timeout, "--replica-timeout (default 10)");
  add_flag(*command, "--json", options->json, "one JSON object");
  command->callback([options] {
    bench::print_machine_line(options->json);
    bench::FtBenchConfig config;
    config.model = options->model;
    config.batch = integer_setting("--batch", options->batch, 1, 1 << 20);
    config.steps = integer_setting("--steps", options->steps, 12, 100000);
    config.cost_steps = integer_setting("--cost-steps", options->cost_steps, 3, 100000);
    config.repeats = static_cast<int>(integer_setting("--repeats", options->repeats, 1, 100));
    config.groups = static_cast<int>(integer_setting("--groups", options->groups, 2, 16));
    config.timeout = static_cast<double>(integer_setting("--timeout", options->timeout, 1, 3600));
    const bench::FtBenchResult result =
        bench::run_ft_bench(config, std::filesystem::read_symlink("/proc/self/exe").string());
    if (options->json) {
      std::cout << to_json(result).dump() << '\n';
    } else {
      print(result, config);
    }
  });
}

}  // namespace meshtensor::cli
