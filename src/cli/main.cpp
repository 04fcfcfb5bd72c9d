#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <iostream>
#include <new>
#include <string_view>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/core/memory.hpp>

#include "commands.hpp"
#include "options.hpp"

namespace {

constexpr int kBadInput = 2;

// What CLI11 lets through but meshtensor refuses, found before parsing:
// - a command that does not exist (`meshtensor plann`, `meshtensor bench collectve`): the first
//   token after each command that needs a subcommand must be one of its subcommands;
// - a value given to a flag (`--json=`, `--json=yes`): flags take none;
// - an empty value given to an option (`--log ""`, `--mesh=`): no option means anything by it.
// Returns the complaint, or empty.
std::string malformed(CLI::App& app, int argc, char** argv) {
  CLI::App* at = &app;
  std::string path = "meshtensor";
  int i = 1;
  for (; i < argc && at->get_require_subcommand_min() > 0; ++i) {
    const std::string_view token = argv[i];
    if (token.empty() || token.front() == '-') break;  // an option: judged below or by CLI11
    std::vector<std::string> names;
    CLI::App* next = nullptr;
    for (CLI::App* sub : at->get_subcommands({})) {
      names.push_back(sub->get_name());
      if (sub->get_name() == token) next = sub;
    }
    if (next == nullptr) {
      return fmt::format("unknown command '{} {}': expected {} followed by one of {}", path, token,
                         path, fmt::join(names, ", "));
    }
    at = next;
    path += " " + std::string(token);
  }
  for (; i < argc; ++i) {
    const std::string_view token = argv[i];
    if (token.substr(0, 2) != "--") continue;
    const std::size_t equals = token.find('=');
    const std::string name(token.substr(0, equals));
    const CLI::Option* option = at->get_option_no_throw(name);
    if (option == nullptr) continue;
    if (equals != std::string_view::npos && option->get_expected_max() == 0) {
      return fmt::format("{} is a flag and takes no value, not '{}'", name, token);
    }
    const bool takes_value = option->get_expected_max() > 0;
    const bool empty_value = equals != std::string_view::npos
                                 ? equals + 1 == token.size()
                                 : i + 1 < argc && argv[i + 1][0] == '\0';
    if (takes_value && empty_value)
      return fmt::format("{} was given an empty value: give one, or leave the option out", name);
  }
  return {};
}

int run(int argc, char** argv) {
  CLI::App app{"meshtensor: SPMD tensors sharded over an N-d device mesh"};
  app.set_version_flag("--version", "meshtensor 0.1.0");
  app.require_subcommand(1);
  meshtensor::cli::add_plan_command(app);
  meshtensor::cli::add_check_command(app);
  meshtensor::cli::add_bench_command(app);
  meshtensor::cli::add_train_command(app);
  meshtensor::cli::add_checkpoint_command(app);
  meshtensor::cli::add_generate_command(app);
  meshtensor::cli::add_rl_command(app);
  meshtensor::cli::add_serve_command(app);
  meshtensor::cli::add_coordinator_command(app);
  meshtensor::cli::add_tokenizer_command(app);
  if (const std::string complaint = malformed(app, argc, argv); !complaint.empty()) {
    std::cerr << "meshtensor: error: " << complaint << '\n';
    return kBadInput;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& request) {
    return app.exit(request);
  } catch (const CLI::CallForAllHelp& request) {
    return app.exit(request);
  } catch (const CLI::CallForVersion& request) {
    return app.exit(request);
  } catch (const CLI::ParseError& error) {
    // Malformed command lines take the same form as every other bad input.
    std::cerr << "meshtensor: error: " << error.what() << " (see meshtensor --help)\n";
    return kBadInput;
  }
  return meshtensor::cli::exit_status();
}

/// Standard output's fate: what a command printed must have been written (a full disk, a closed
/// pipe's reader, /dev/full), else the run failed to deliver it.
void check_standard_output() {
  errno = 0;
  std::cout.flush();
  if (!std::cout || std::fflush(stdout) != 0 || std::ferror(stdout) != 0) {
    throw meshtensor::DataError(fmt::format("cannot write standard output: {}",
                                            errno != 0 ? std::strerror(errno) : "write failed"));
  }
}
}  // namespace

/// Exit status: 0 success, 1 a check that found a mismatch, 2 bad input or a request the machine
/// cannot serve (the message names it), 3 internal error.
int main(int argc, char** argv) {
  meshtensor::keep_freed_memory_for_reuse();
  try {
    const int status = run(argc, argv);
    check_standard_output();
    return status;
  } catch (const meshtensor::Error& error) {
    std::cerr << "meshtensor: error: " << meshtensor::cli::with_flag_names(error.what()) << '\n';
    return kBadInput;
  } catch (const std::bad_alloc&) {
    std::cerr << "meshtensor: error: out of memory (std::bad_alloc): the request needs more "
                 "memory than this machine has\n";
    return kBadInput;
  } catch (const std::filesystem::filesystem_error& error) {
    // A path of the user's that the system refused (a loop of links, no permission, ...).
    std::cerr << "meshtensor: error: " << error.what() << '\n';
    return kBadInput;
  } catch (const std::exception& error) {
    std::cerr << "meshtensor: internal error: " << error.what() << '\n';
    return 3;
  } catch (...) {
    std::cerr << "meshtensor: internal error\n";
    return 3;
  }
}
