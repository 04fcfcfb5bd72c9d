#include <exception>
#include <iostream>

#include <CLI/CLI.hpp>

#include <meshtensor/core/error.hpp>

#include "commands.hpp"

namespace meshtensor::cli {
namespace {
int status = 0;
}  // namespace
void set_exit_status(int value) {
  status = value;
}
int exit_status() {
  return status;
}
}  // namespace meshtensor::cli

namespace {
int run(int argc, char** argv) {
  CLI::App app{"meshtensor: SPMD tensors sharded over an N-d device mesh"};
  app.set_version_flag("--version", "meshtensor 0.1.0");
  app.require_subcommand(1);
  meshtensor::cli::add_plan_command(app);
  meshtensor::cli::add_check_command(app);
  meshtensor::cli::add_bench_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    return app.exit(error);
  }
  return meshtensor::cli::exit_status();
}
}  // namespace

/// Exit status: 0 success, 2 bad input (the message names it), 3 internal error; CLI11's own
/// statuses for malformed command lines.
int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const meshtensor::Error& error) {
    std::cerr << "meshtensor: error: " << error.what() << '\n';
    return 2;
  } catch (const std::exception& error) {
    std::cerr << "meshtensor: internal error: " << error.what() << '\n';
    return 3;
  } catch (...) {
    std::cerr << "meshtensor: internal error\n";
    return 3;
  }
}
