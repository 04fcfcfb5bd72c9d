#pragma once

#include <cstdint>
#include <string>

#include <CLI/CLI.hpp>

#include <meshtensor/train/trainer.hpp>

namespace meshtensor::cli {

/// The options that place a trainer on ranks, as the command line gives them.
struct TrainerLayoutOptions {
  std::string strategy;  ///< empty: hsdp with --mesh, ddp otherwise
  std::string mesh;
  std::string names;  ///< with --mesh: dims dp, fsdp, tp by name
  bool sequence_parallel = false;
};

/// Parses the layout into `config` (strategy, replicas, named mesh, sequence parallel).
/// ParseError naming the option: --names without --mesh, --names with --strategy, a --mesh that
/// is not RxS for hsdp, --sequence-parallel without a tp dim, more ranks than a run may have.
void parse_trainer_layout(const TrainerLayoutOptions& options, train::TrainConfig& config);

/// The rank count of --mesh AxBx... (the product of its sizes), or 0 without --mesh.
std::int64_t mesh_ranks(const std::string& mesh);

/// The ranks of a run: the product of --mesh, which --ranks (when given) must equal, else
/// --ranks. ParseError naming both when they differ.
std::int64_t layout_ranks(const std::string& ranks, const CLI::Option* ranks_option,
                          const std::string& mesh);

}  // namespace meshtensor::cli
