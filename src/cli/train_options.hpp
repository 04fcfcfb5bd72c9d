#pragma once

#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include <meshtensor/train/dataset.hpp>
#include <meshtensor/train/task.hpp>
#include <meshtensor/train/trainer.hpp>

#include "options.hpp"
#include "timing.hpp"

namespace meshtensor::cli {

using bench::median;

/// The options of `meshtensor train`, as given (parsed by parse_config); the training
/// benchmarks share them.
struct TrainOptions {
  std::string data;  // empty: the model's default data
  std::string model = "mlp:1024,1024";
  std::string activation = "relu";
  CLI::Option* activation_option = nullptr;
  bool layernorm = false;
  std::string epochs = "8";
  CLI::Option* epochs_option = nullptr;
  std::string steps = "0";
  CLI::Option* steps_option = nullptr;
  std::string batch;          // empty: the model's default
  std::string warmup;         // empty: the model's default
  std::string eval_every;     // empty: the model's default
  std::string micro_batches;  // empty: 1, or 2 per pp rank with a pipeline
  std::string pipeline_schedule = "1f1b";
  std::string virtual_stages;  ///< empty: the schedule's default
  std::string activation_checkpointing = "none";
  std::string optimizer = "adamw";
  std::string lr = "1e-3";
  std::string weight_decay = "0";
  std::string momentum = "0.9";
  std::string schedule = "cosine";
  std::string ranks = "2";
  CLI::Option* ranks_option = nullptr;
  std::string backend = "threads";
  std::string mode = "ordered";
  std::string seed = "0";
  std::string log;
  std::string plot;
  bool json = false;
  TimeoutOption timeout;
  std::string strategy;  // empty: hsdp with --mesh, ddp otherwise
  std::string mesh;
  std::string names;  // with --mesh: dims dp, fsdp, tp by name
  bool sequence_parallel = false;
  std::string clip_grad_norm = "0";
  bool explain_parallelism = false;
  bool verify_generator = false;
  bool reshard_after_forward = false;
  bool no_reshard_after_forward = false;
  std::string prefetch = "1";
  std::string param_dtype = "f32";
  std::string reduce_dtype = "f32";
  std::string micro_batch_mode = "no-sync";
  std::string link;
  TopologyOptions topology;  // --ranks-per-host and the other levels' links (--link above)
  std::string trace;
  std::string save;
  std::string save_every = "0";
  std::string keep_checkpoints = "0";
  std::string resume;
  std::string stop_after = "0";
};

/// The task a command trains, with the data it holds.
struct LoadedTask {
  std::unique_ptr<train::Dataset> images;
  std::unique_ptr<train::Task> task;
  std::string data;  // the path read
  bool language = false;
};

/// The TrainConfig of `options`; ParseError naming the first bad option.
train::TrainConfig parse_config(const TrainOptions& options);

/// Parses --model (with --activation and --layernorm for an MLP) and loads its data: --data, or
/// the model's default (Fashion-MNIST for mlp, Debian's fortunes for gpt).
LoadedTask load_task(const TrainOptions& options);

/// Registers the options `meshtensor train` and the training benchmarks share, with the same
/// meaning and defaults.
void add_shared_train_options(CLI::App& command, TrainOptions& options);

/// add_shared_train_options and a benchmark's --steps (default `steps`, timed) and --epochs.
void add_timed_train_options(CLI::App& command, TrainOptions& options, const std::string& steps);

/// The median of per-step figures after the first `warmup` steps (which set things up and warm
/// caches; at least one value is kept); 0 when empty.
double steady_median(const std::vector<double>& values, std::size_t warmup);

/// steady_median of step times after the first two.
double steady_step_seconds(const std::vector<double>& steps);

}  // namespace meshtensor::cli
