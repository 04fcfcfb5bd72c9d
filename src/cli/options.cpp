#include "options.hpp"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <iostream>

#include <fmt/format.h>

#include <meshtensor/comm/communicator.hpp>
#include <meshtensor/comm/threads_backend.hpp>
#include <meshtensor/core/error.hpp>
#include <meshtensor/core/shape.hpp>
#include <meshtensor/kernels/simd.hpp>

namespace meshtensor::cli {

std::int64_t integer_option(std::string_view option, const std::string& text, std::int64_t min,
                            std::int64_t max) {
  const std::int64_t value = parse_count(text, max, option);
  if (value < min) {
    throw ParseError(fmt::format("{}: '{}' is too small (at least {})", option, text, min));
  }
  return value;
}

std::uint64_t seed_option(std::string_view option, const std::string& text) {
  return parse_unsigned(text, UINT64_MAX, option);
}

std::vector<std::string> list_option(std::string_view option, const std::string& text) {
  std::vector<std::string> entries;
  for (std::string_view entry : split(text, ',')) {
    if (entry.empty()) {
      throw ParseError(
          fmt::format("{} '{}' has an empty entry: expected values joined by ','", option, text));
    }
    entries.emplace_back(entry);
  }
  return entries;
}

CLI::Option* add_flag(CLI::App& command, const std::string& name, bool& target,
                      const std::string& description) {
  return command.add_flag(name, target, description)->disable_flag_override();
}

void TimeoutOption::add_to(CLI::App& command) {
  option = command.add_option("--timeout", text,
                              "seconds a collective waits for the other ranks before the run "
                              "fails naming them (default: MESHTENSOR_TIMEOUT, else 300)");
}

double real_option(std::string_view option, const std::string& text, double min, double max) {
  double value = 0.0;
  const char* begin = text.data();
  const char* end = begin + text.size();
  const auto [at, error] = std::from_chars(begin, end, value);
  if (text.empty() || error != std::errc{} || at != end || !std::isfinite(value)) {
    throw ParseError(fmt::format("{} '{}' is not a number", option, text));
  }
  if (value < min || value > max) {
    throw ParseError(fmt::format("{} {} is outside [{}, {}]", option, text, min, max));
  }
  return value;
}

void TimeoutOption::apply() const {
  if (option != nullptr && option->count() > 0) {
    comm::set_default_timeout(comm::parse_timeout_seconds(text, "--timeout"));
  }
}

void print_machine_line(bool json) {
  const char* mpi_rank = std::getenv("OMPI_COMM_WORLD_RANK");  // one line for an mpirun job
  if (json || (mpi_rank != nullptr && std::string_view(mpi_rank) != "0")) return;
  std::cout << "machine: " << kernels::machine_description() << '\n';
}

std::int64_t tensor_parallel_option(const std::string& ranks, const std::string& mesh,
                                    const std::string& names, std::string_view command) {
  if (!mesh.empty() || !names.empty()) {
    if (!ranks.empty()) throw ParseError("--ranks and --mesh exclude each other: give one");
    if (names != "tp") {
      throw ParseError(fmt::format(
          "{} runs on a 1-D tensor-parallel mesh: --names must be tp, got '{}'", command, names));
    }
    return integer_option("--mesh", mesh, 1, comm::kMaxThreadsRanks);
  }
  return ranks.empty() ? 0 : integer_option("--ranks", ranks, 1, comm::kMaxThreadsRanks);
}

}  // namespace meshtensor::cli
