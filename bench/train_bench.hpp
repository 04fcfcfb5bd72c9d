#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <meshtensor/comm/threads_backend.hpp>
#include <meshtensor/mesh/topology.hpp>
#include <meshtensor/train/trainer.hpp>

namespace meshtensor::bench {

/// What the training benchmarks share: the task, the config the shared options of `meshtensor
/// train` gave (steps, batch, optimizer, lr, seed), and the output form.
struct TrainingBenchInput {
  const train::Task* task = nullptr;
  std::string model;  ///< the model as given, for the first line
  train::TrainConfig config;
  bool json = false;  ///< one JSON object instead of text
};

/// One data-parallel layout of `bench train`: ranks, and micro-batches per rank.
struct TrainLayout {
  std::int64_t ranks = 1;
  std::int64_t micro_batches = 1;
};

/// `meshtensor bench train`: ordered and exact runs on `ranks`, alternated `rounds` times (the
/// exact over ordered step time), and exact runs on `layouts` (default: `ranks`) that must end
/// on one digest.
struct TrainBenchConfig {
  TrainingBenchInput input;
  std::int64_t ranks = 2;
  std::vector<TrainLayout> layouts;
  std::int64_t rounds = 3;
};

/// Runs and prints `bench train`; 0, or 1 when digests or replicas differ.
int run_train_bench(const TrainBenchConfig& bench);

/// `meshtensor bench fsdp`: FSDP with and without prefetch and DDP on `ranks` thread ranks with
/// and without the simulated `link`; with `placed`, FSDP and HSDP on `hosts` topology-aware
/// against blind; exact runs over DDP, FSDP, HSDP and micro-batch layouts.
struct FsdpBenchConfig {
  TrainingBenchInput input;
  std::int64_t ranks = 8;
  std::string link_text;  ///< the link as given (LATENCY,GBPS)
  comm::LinkDelay link;
  Topology hosts;
  bool placed = false;  ///< hosts were given: run the topology pairs
  std::int64_t exact_steps = 3;
  std::int64_t hsdp_replicas = 2;
};

/// Runs and prints `bench fsdp`; 0, or 1 when digests or replicas differ.
int run_fsdp_bench(const FsdpBenchConfig& bench);

/// `meshtensor bench tp`: FSDP x TP layouts on 8 thread ranks against FSDP alone, with and without
/// the simulated `link`, and exact against ordered tp 2 over `rounds` alternated runs.
struct TpBenchConfig {
  TrainingBenchInput input;
  std::string link_text;
  comm::LinkDelay link;
  Topology hosts;
  bool placed = false;
  std::int64_t rounds = 2;
};

/// Runs and prints `bench tp`; 0, or 1 when replicas differ.
int run_tp_bench(const TpBenchConfig& bench);

}  // namespace meshtensor::bench
