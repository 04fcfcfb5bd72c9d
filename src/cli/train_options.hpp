#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include <meshtensor/ft/replica_groups.hpp>
#include <meshtensor/train/dataset.hpp>
#include <meshtensor/train/settings.hpp>
#include <meshtensor/train/task.hpp>
#include <meshtensor/train/trainer.hpp>

#include "options.hpp"
#include "setting_options.hpp"

namespace meshtensor::cli {

/// The options of `meshtensor train`, as given; the training benchmarks share them. The
/// training settings themselves go to train::TrainSettings by field name (parse_config).
struct TrainOptions {
  std::string data;       // empty: the model's default data
  std::string tokenizer;  // a tokenizer.json; empty: bytes
  std::string model = "mlp:1024,1024";
  CLI::Option* model_option = nullptr;
  std::string activation = "relu";
  CLI::Option* activation_option = nullptr;
  bool layernorm = false;
  std::string ranks = "2";
  CLI::Option* ranks_option = nullptr;
  std::string backend = "threads";
  std::string log;
  std::string plot;
  bool json = false;
  TimeoutOption timeout;
  bool explain_parallelism = false;
  bool no_reshard_after_forward = false;  // --reshard-after-forward is the field's flag
  bool no_sample = false;                 // the field `sample` is on by default
  std::string link;
  TopologyOptions topology;  // --ranks-per-host and the other levels' links (--link above)
  std::string trace;         // the file; the setting `trace` records the events
  SettingOptions settings;   // the fields of train::TrainSettings
  std::map<std::string, std::string> defaults;  // a benchmark's own defaults, by field
  ft::ReplicaGroupsConfig replica_groups;       // a fault-tolerant run's (train only)
};

/// The task a command trains, with the data it holds.
struct LoadedTask {
  std::unique_ptr<train::Dataset> images;
  std::unique_ptr<train::Task> task;
  std::string data;  // the path read
  bool language = false;
};

/// The settings `options` give (a benchmark's defaults included).
train::TrainSettings train_settings(const TrainOptions& options);

/// Whether `options` train a language model (a decoder --model, or an --init).
bool trains_language(const TrainOptions& options);

/// The TrainConfig of `options`; ParseError naming the first bad option.
train::TrainConfig parse_config(const TrainOptions& options);

/// The ranks of a run: the product of --mesh, which --ranks (when given) must equal, else
/// --ranks. ParseError naming both when they differ.
std::int64_t layout_ranks(const TrainOptions& options, const train::TrainSettings& settings);

/// Parses --model (with --activation and --layernorm for an MLP) and loads its data: --data, or
/// the model's default (Fashion-MNIST for mlp, Debian's fortunes for gpt).
LoadedTask load_task(const TrainOptions& options);

/// Registers the options `meshtensor train` and the training benchmarks share, with the same
/// meaning and defaults.
void add_shared_train_options(CLI::App& command, TrainOptions& options);

/// add_shared_train_options and a benchmark's --steps (default `steps`, timed) and --epochs.
void add_timed_train_options(CLI::App& command, TrainOptions& options, const std::string& steps);

/// The settings mode, strategy and the like as the run's first line names them.
std::string strategy_text(const TrainOptions& options);

}  // namespace meshtensor::cli
