#include "train_layout.hpp"

#include <fmt/format.h>

#include <meshtensor/comm/threads_backend.hpp>
#include <meshtensor/core/error.hpp>

#include "options.hpp"

namespace meshtensor::cli {

namespace {

/// --strategy and --mesh RxS (hsdp) when the mesh is not given by dim names.
void parse_strategy_mesh(const TrainerLayoutOptions& options, train::TrainConfig& config) {
  if (options.sequence_parallel)
    throw ParseError("--sequence-parallel needs a tp mesh dim: --mesh ... --names ...,tp");
  config.strategy = train::parse_strategy(
      options.strategy.empty() ? (options.mesh.empty() ? "ddp" : "hsdp") : options.strategy);
  if (!options.mesh.empty()) {
    if (config.strategy != train::Strategy::hsdp) {
      throw ParseError(
          fmt::format("--mesh {} is the replicate x shard mesh of hsdp; --strategy "
                      "{} runs on a 1-D mesh of --ranks",
                      options.mesh, options.strategy));
    }
    const auto cross = options.mesh.find('x');
    if (cross == std::string::npos || options.mesh.find('x', cross + 1) != std::string::npos)
      throw ParseError(fmt::format("--mesh '{}' is not RxS (e.g. 2x4)", options.mesh));
    config.replicas =
        integer_option("--mesh", options.mesh.substr(0, cross), 1, comm::kMaxThreadsRanks);
    integer_option("--mesh", options.mesh.substr(cross + 1), 1, comm::kMaxThreadsRanks);
  }
}

}  // namespace

void parse_trainer_layout(const TrainerLayoutOptions& options, train::TrainConfig& config) {
  config.sequence_parallel = options.sequence_parallel;
  if (options.names.empty()) {
    parse_strategy_mesh(options, config);
    return;
  }
  if (options.mesh.empty()) throw ParseError("--names names the dims of --mesh; give --mesh too");
  if (!options.strategy.empty()) {
    throw ParseError(
        fmt::format("--names {} gives the layout by mesh dim names; --strategy {} does not apply",
                    options.names, options.strategy));
  }
  config.mesh = train::parse_named_mesh(options.mesh, options.names);
  if (config.mesh.ranks() > comm::kMaxThreadsRanks) {
    throw ParseError(
        fmt::format("--mesh {} has more than {} ranks", options.mesh, comm::kMaxThreadsRanks));
  }
}

std::int64_t mesh_ranks(const std::string& mesh) {
  if (mesh.empty()) return 0;
  std::int64_t ranks = 1;
  std::size_t start = 0;
  while (true) {
    const std::size_t cross = mesh.find('x', start);
    ranks *= integer_option("--mesh", mesh.substr(start, cross - start), 1, comm::kMaxThreadsRanks);
    if (ranks > comm::kMaxThreadsRanks) return ranks;
    if (cross == std::string::npos) return ranks;
    start = cross + 1;
  }
}

std::int64_t layout_ranks(const std::string& ranks_text, const CLI::Option* ranks_option,
                          const std::string& mesh) {
  std::int64_t ranks = integer_option("--ranks", ranks_text, 1, comm::kMaxThreadsRanks);
  const std::int64_t from_mesh = mesh_ranks(mesh);
  if (from_mesh > 0 && ranks_option != nullptr && ranks_option->count() > 0 && from_mesh != ranks) {
    throw ParseError(
        fmt::format("--mesh {} has {} ranks but --ranks is {}", mesh, from_mesh, ranks));
  }
  if (from_mesh > comm::kMaxThreadsRanks)
    throw ParseError(fmt::format("--mesh {} has more than {} ranks", mesh, comm::kMaxThreadsRanks));
  return from_mesh > 0 ? from_mesh : ranks;
}

}  // namespace meshtensor::cli
