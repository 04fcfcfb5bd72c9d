#include <iostream>

#include <CLI/CLI.hpp>

#include <meshtensor/core/error.hpp>

#include "commands.hpp"

int main(int argc, char** argv) {
  CLI::App app{"meshtensor: SPMD tensors sharded over an N-d device mesh"};
  app.set_version_flag("--version", "meshtensor 0.1.0");
  app.require_subcommand(1);
  meshtensor::cli::add_plan_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    return app.exit(error);
  } catch (const meshtensor::Error& error) {
    std::cerr << "meshtensor: error: " << error.what() << '\n';
    return 2;
  }
  return 0;
}
