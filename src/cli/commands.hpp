#pragma once

#include <CLI/CLI.hpp>

namespace meshtensor::cli {

/// Registers `meshtensor plan`.
void add_plan_command(CLI::App& app);
/// Registers `meshtensor check`.
void add_check_command(CLI::App& app);
/// Registers `meshtensor train`.
void add_train_command(CLI::App& app);
/// Registers `meshtensor checkpoint inspect` and `meshtensor checkpoint verify`.
void add_checkpoint_command(CLI::App& app);
/// Registers `meshtensor rl`.
void add_rl_command(CLI::App& app);
/// Registers `meshtensor generate`.
void add_generate_command(CLI::App& app);
/// Registers `meshtensor serve`.
void add_serve_command(CLI::App& app);
/// Registers `meshtensor checkpoint export` under `checkpoint`.
void add_checkpoint_export(CLI::App& checkpoint_command);

/// Registers `meshtensor coordinator`.
void add_coordinator_command(CLI::App& app);

/// Registers `meshtensor tokenizer encode|decode|from-gpt2`.
void add_tokenizer_command(CLI::App& app);
/// Registers `meshtensor bench` and its benchmarks.
void add_bench_command(CLI::App& app);

}  // namespace meshtensor::cli
