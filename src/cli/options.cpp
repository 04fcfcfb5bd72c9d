#include "options.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <iostream>

#include <fmt/format.h>

#include <meshtensor/comm/communicator.hpp>
#include <meshtensor/comm/threads_backend.hpp>
#include <meshtensor/core/error.hpp>
#include <meshtensor/core/setting_text.hpp>
#include <meshtensor/core/shape.hpp>
#include <meshtensor/kernels/simd.hpp>

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

CLI::Option* add_flag(CLI::App& command, const std::string& name, bool& target,
                      const std::string& description) {
  return command.add_flag(name, target, description)->disable_flag_override();
}

void TimeoutOption::add_to(CLI::App& command) {
  option = command.add_option("--timeout", text,
                              "seconds a collective waits for the other ranks before the run "
                              "fails naming them (default: MESHTENSOR_TIMEOUT, else 300)");
}

void TimeoutOption::apply() const {
  if (option != nullptr && option->count() > 0) {
    comm::set_default_timeout(comm::parse_timeout_seconds(text, "--timeout"));
  }
}

std::int64_t tensor_parallel_option(const std::string& ranks, const std::string& mesh,
                                    const std::string& names, std::string_view command) {
  if (!mesh.empty() || !names.empty()) {
    if (!ranks.empty()) throw ParseError("--ranks and --mesh exclude each other: give one");
    if (names.find("cp") != std::string::npos) {
      throw ParseError(fmt::format(
          "{} decodes a token at a time with a key/value cache: context parallelism (cp in "
          "--names '{}') splits training sequences only; give --names tp",
          command, names));
    }
    if (names != "tp") {
      throw ParseError(fmt::format(
          "{} runs on a 1-D tensor-parallel mesh: --names must be tp, got '{}'", command, names));
    }
    return integer_setting("--mesh", mesh, 1, comm::kMaxThreadsRanks);
  }
  return ranks.empty() ? 0 : integer_setting("--ranks", ranks, 1, comm::kMaxThreadsRanks);
}

std::int64_t mesh_or_ranks(const std::string& ranks_text, const CLI::Option* ranks_option,
                           std::int64_t mesh_ranks, const std::string& mesh) {
  const std::int64_t ranks = integer_setting("--ranks", ranks_text, 1, comm::kMaxThreadsRanks);
  if (mesh_ranks > 0 && ranks_option != nullptr && ranks_option->count() > 0 &&
      mesh_ranks != ranks) {
    throw ParseError(
        fmt::format("--mesh {} has {} ranks but --ranks is {}", mesh, mesh_ranks, ranks));
  }
  return mesh_ranks > 0 ? mesh_ranks : ranks;
}

void TopologyOptions::add_to(CLI::App& command, bool with_link) {
  command.add_option("--ranks-per-host", ranks_per_host,
                     "ranks per host, in rank order: N (repeated; the last host may hold fewer) "
                     "or N,N,... (default: one host)");
  command.add_option("--ranks-per-domain", ranks_per_domain,
                     "ranks per domain inside a host (e.g. an NVLink island)");
  if (with_link) {
    command.add_option("--link", link,
                       "link inside a domain, LATENCY,GBPS, e.g. 20us,10 (threads backend: "
                       "simulated)");
  }
  command.add_option("--link-host", link_host,
                     "link between the domains of a host, LATENCY,GBPS (default: --link plus 5us, "
                     "a quarter of its bandwidth)");
  command.add_option("--link-inter", link_inter,
                     "link between hosts, LATENCY,GBPS (default: --link plus 20us, a twentieth of "
                     "its bandwidth)");
}

LinkLevels TopologyOptions::links() const {
  LinkLevels levels =
      default_links(link.empty() ? LinkFigures{} : parse_link_figures(link, "--link"));
  if (!link_host.empty()) levels[1] = parse_link_figures(link_host, "--link-host");
  if (!link_inter.empty()) levels[2] = parse_link_figures(link_inter, "--link-inter");
  return levels;
}

Topology TopologyOptions::topology(std::int64_t ranks) const {
  if (!placed()) {
    if (!ranks_per_domain.empty()) throw ParseError("--ranks-per-domain needs --ranks-per-host");
    return Topology(std::vector<int>(static_cast<std::size_t>(ranks), 0), {}, {}, links());
  }
  std::vector<std::int64_t> sizes;
  for (const std::string& entry : list_setting("--ranks-per-host", ranks_per_host))
    sizes.push_back(integer_setting("--ranks-per-host", entry, 1, 1 << 20));
  const std::int64_t per_domain =
      ranks_per_domain.empty()
          ? 0
          : integer_setting("--ranks-per-domain", ranks_per_domain, 1, 1 << 20);
  return Topology::from_host_sizes(ranks, sizes, per_domain, links());
}

comm::SimulatedNetwork TopologyOptions::network(std::int64_t ranks) const {
  Topology where = topology(ranks);
  comm::LinkDelay delay = linked() ? comm::simulated_topology_link(where) : comm::LinkDelay();
  return {std::move(delay), std::move(where)};
}

void TopologyOptions::check_backend(bool mpi) const {
  if (mpi && linked()) {
    throw ParseError(
        "--link, --link-host and --link-inter simulate a network on the threads backend; mpi "
        "has a real one");
  }
  if (mpi && (placed() || !ranks_per_domain.empty())) {
    throw ParseError(
        "--ranks-per-host and --ranks-per-domain place the ranks of the threads backend; mpi "
        "detects its hosts from their names");
  }
}

std::string with_flag_names(std::string_view message) {
  return with_setting_names(message, [](std::string_view field) {
    std::string flag = "--" + std::string(field);
    std::replace(flag.begin() + 2, flag.end(), '_', '-');
    return flag;
  });
}

}  // namespace meshtensor::cli
