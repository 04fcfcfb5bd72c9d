#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <CLI/CLI.hpp>

#include <meshtensor/comm/threads_backend.hpp>
#include <meshtensor/core/setting_text.hpp>
#include <meshtensor/mesh/topology.hpp>

namespace meshtensor::cli {

/// Sets the status `meshtensor` exits with after a command that ran to the end (e.g. 1 when a
/// check found a mismatch).
void set_exit_status(int status);
/// The status set so far (0 by default).
int exit_status();

/// The tensor-parallel degree of a command that runs on a 1-D tp mesh: `--ranks N`, or
/// `--mesh N --names tp` (0 when neither is given). ParseError naming the options otherwise.
std::int64_t tensor_parallel_option(const std::string& ranks, const std::string& mesh,
                                    const std::string& names, std::string_view command);

/// The ranks of a run: `mesh_ranks` (the product of --mesh, 0 without one), which --ranks must
/// equal when given, else --ranks. ParseError naming both when they differ.
std::int64_t mesh_or_ranks(const std::string& ranks_text, const CLI::Option* ranks_option,
                           std::int64_t mesh_ranks, const std::string& mesh);

/// Adds a flag that takes no value: `--json=yes` and `--json=` are errors.
CLI::Option* add_flag(CLI::App& command, const std::string& name, bool& target,
                      const std::string& description);

/// `--timeout SECONDS`: the collective timeout of the run (default: MESHTENSOR_TIMEOUT, else
/// 300 s). apply() parses and applies it when it was given.
struct TimeoutOption {
  std::string text;
  CLI::Option* option = nullptr;
  /// Registers the option on `command`.
  void add_to(CLI::App& command);
  /// Sets the process's default collective timeout when the option was given.
  void apply() const;
};

/// Where the ranks sit and what links join them (docs/topology.md):
///   --ranks-per-host N | N,N,...  ranks per host in rank order (one N repeats; the last host
///                                 takes what is left, so a mesh that N does not divide is jagged)
///   --ranks-per-domain N          domains of N ranks inside each host (e.g. NVLink islands)
///   --link LATENCY,GBPS           inside a domain (the simulated link on the threads backend)
///   --link-host LATENCY,GBPS      between the domains of one host
///   --link-inter LATENCY,GBPS     between hosts
/// Unset levels follow default_links() from the one inside.
struct TopologyOptions {
  std::string ranks_per_host;
  std::string ranks_per_domain;
  std::string link;
  std::string link_host;
  std::string link_inter;
  /// Registers the options; `with_link` adds --link too (commands that own it register it).
  void add_to(CLI::App& command, bool with_link = true);
  /// True when --ranks-per-host was given.
  bool placed() const { return !ranks_per_host.empty(); }
  /// True when any link figure was given: the threads backend then charges them.
  bool linked() const { return !link.empty() || !link_host.empty() || !link_inter.empty(); }
  /// The links per level.
  LinkLevels links() const;
  /// The topology of `ranks` ranks (one host when --ranks-per-host is not given). ParseError or
  /// InvalidArgument naming the option and the value.
  Topology topology(std::int64_t ranks) const;
  /// What a threads world of `ranks` simulates: the topology, and its links charged per level
  /// when any link was given.
  comm::SimulatedNetwork network(std::int64_t ranks) const;
  /// ParseError unless the options fit the backend: on mpi the topology is detected and the
  /// links are real, so none of these options apply.
  void check_backend(bool mpi) const;
};

/// `message` (a library error or warning) with each setting it names as `field_name` given as
/// this tool's flag, --field-name: the library names settings by their fields, each front end
/// by its own names.
std::string with_flag_names(std::string_view message);

}  // namespace meshtensor::cli
