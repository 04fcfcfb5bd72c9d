#pragma once

#include <CLI/CLI.hpp>

namespace meshtensor::cli {

/// Registers `meshtensor plan`.
void add_plan_command(CLI::App& app);
/// Registers `meshtensor check`.
void add_check_command(CLI::App& app);
/// Registers `meshtensor train`.
void add_train_command(CLI::App& app);
/// Registers `meshtensor bench train` under `bench`.
void add_train_bench(CLI::App& bench);
/// Registers `meshtensor bench fsdp`.
void add_fsdp_bench(CLI::App& bench);
/// Registers `meshtensor bench tp`.
void add_tp_bench(CLI::App& bench);
/// `meshtensor bench pp`.
void add_pp_bench(CLI::App& bench);
/// Registers `meshtensor checkpoint inspect` and `meshtensor checkpoint verify`.
void add_checkpoint_command(CLI::App& app);
/// Registers `meshtensor bench generate`.
void add_generate_bench(CLI::App& bench);
/// Registers `meshtensor bench rl`.
void add_rl_bench(CLI::App& bench);
/// Registers `meshtensor rl`.
void add_rl_command(CLI::App& app);
/// Registers `meshtensor generate`.
void add_generate_command(CLI::App& app);
/// Registers `meshtensor serve`.
void add_serve_command(CLI::App& app);
/// Registers `meshtensor bench serve`.
void add_serve_bench(CLI::App& bench);
/// Registers `meshtensor bench checkpoint`.
void add_checkpoint_bench(CLI::App& bench);
/// Registers `meshtensor bench` and its benchmarks.
void add_bench_command(CLI::App& app);

/// Sets the status `meshtensor` exits with after a command that ran to the end (e.g. 1 when a
/// check found a mismatch).
void set_exit_status(int status);
/// The status set so far (0 by default).
int exit_status();

}  // namespace meshtensor::cli
