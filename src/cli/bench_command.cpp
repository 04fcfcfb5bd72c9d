#include "bench_commands.hpp"
#include "commands.hpp"

namespace meshtensor::cli {

namespace {

/// Every benchmark of `meshtensor bench`, in the order help lists them.
constexpr void (*kBenchmarks[])(CLI::App&) = {
    add_peak_bench, add_collective_bench, add_redistribute_bench, add_matmul_bench,
    add_plan_bench, add_train_bench,      add_fsdp_bench,         add_tp_bench,
    add_pp_bench,   add_cp_bench,         add_generate_bench,     add_checkpoint_bench,
    add_rl_bench,   add_serve_bench,      add_tokenize_bench,     add_ft_bench};

}  // namespace

void add_bench_command(CLI::App& app) {
  CLI::App* bench = app.add_subcommand("bench", "Benchmarks that report ratios to a baseline");
  bench->require_subcommand(1);
  for (const auto add : kBenchmarks)
    add(*bench);
}

}  // namespace meshtensor::cli
