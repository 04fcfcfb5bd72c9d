#pragma once

// The command-line entries of `meshtensor bench`: each registers one benchmark's options (with
// the command line's option helpers) and runs it. src/cli/bench_command.cpp lists them.

#include <CLI/CLI.hpp>

namespace meshtensor::cli {

/// `meshtensor bench peak`.
void add_peak_bench(CLI::App& bench);
/// `meshtensor bench collective`.
void add_collective_bench(CLI::App& bench);
/// `meshtensor bench redistribute`.
void add_redistribute_bench(CLI::App& bench);
/// `meshtensor bench matmul`.
void add_matmul_bench(CLI::App& bench);
/// `meshtensor bench plan`.
void add_plan_bench(CLI::App& bench);
/// `meshtensor bench train`.
void add_train_bench(CLI::App& bench);
/// `meshtensor bench fsdp`.
void add_fsdp_bench(CLI::App& bench);
/// `meshtensor bench tp`.
void add_tp_bench(CLI::App& bench);
/// `meshtensor bench pp`.
void add_pp_bench(CLI::App& bench);
/// `meshtensor bench cp`.
void add_cp_bench(CLI::App& bench);
/// `meshtensor bench generate`.
void add_generate_bench(CLI::App& bench);
/// `meshtensor bench checkpoint`.
void add_checkpoint_bench(CLI::App& bench);
/// `meshtensor bench rl`.
void add_rl_bench(CLI::App& bench);
/// `meshtensor bench serve`.
void add_serve_bench(CLI::App& bench);
/// `meshtensor bench ft`.
void add_ft_bench(CLI::App& bench);
/// `meshtensor bench tokenize`.
void add_tokenize_bench(CLI::App& bench);

}  // namespace meshtensor::cli
