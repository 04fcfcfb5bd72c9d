#pragma once

#include <CLI/CLI.hpp>

namespace meshtensor::cli {

/// Registers `meshtensor plan`.
void add_plan_command(CLI::App& app);
/// Registers `meshtensor bench` and its benchmarks.
void add_bench_command(CLI::App& app);

}  // namespace meshtensor::cli
