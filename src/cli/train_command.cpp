#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <unistd.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <meshtensor/comm/threads_backend.hpp>
#include <meshtensor/core/digest.hpp>
#include <meshtensor/core/error.hpp>
#include <meshtensor/core/memory.hpp>
#include <meshtensor/train/result_json.hpp>
#include <meshtensor/train/trainer.hpp>

#include "backend.hpp"
#include "commands.hpp"
#include "options.hpp"
#include "output_files.hpp"
#include "plot.hpp"
#include "train_layout.hpp"
#include "train_options.hpp"

namespace meshtensor::cli {

namespace {

constexpr std::int64_t kMaxCount = std::int64_t{1} << 40;

const std::string kGptBatch = std::to_string(train::LanguageDefaults::batch);
constexpr std::int64_t kGptSteps = train::LanguageDefaults::steps;
const std::string kGptWarmup = std::to_string(train::LanguageDefaults::warmup);
const std::string kGptEvalEvery = std::to_string(train::LanguageDefaults::eval_every);

}  // namespace

train::TrainConfig parse_config(const TrainOptions& options) {
  train::TrainConfig config;
  const bool gpt = nn::is_gpt_model(options.model);
  if (options.steps_option->count() > 0 && options.epochs_option->count() > 0)
    throw ParseError("--epochs and --steps exclude each other: give one");
  config.steps = integer_option("--steps", options.steps, 0, kMaxCount);
  config.epochs = integer_option("--epochs", options.epochs, 1, 1 << 20);
  if (options.steps_option->count() > 0 && config.steps == 0)
    throw ParseError("--steps 0: give at least one step");
  if (gpt && options.steps_option->count() == 0 && options.epochs_option->count() == 0 &&
      config.steps == 0)
    config.steps = kGptSteps;
  config.batch = integer_option(
      "--batch", options.batch.empty() ? (gpt ? kGptBatch : "256") : options.batch, 1, 1 << 21);
  config.eval_every = integer_option(
      "--eval-every", options.eval_every.empty() ? (gpt ? kGptEvalEvery : "0") : options.eval_every,
      0, kMaxCount);
  config.pipeline_schedule = pp::parse_schedule(options.pipeline_schedule);
  // 0: the schedule's default (2 for interleaved-1f1b); an explicit value is at least 1.
  config.virtual_stages =
      options.virtual_stages.empty()
          ? 0
          : integer_option("--virtual-stages", options.virtual_stages, 1, 1 << 10);
  config.activation_checkpointing = pp::parse_checkpointing(options.activation_checkpointing);
  config.optimizer = train::parse_optimizer(options.optimizer);
  config.schedule.base = real_option("--lr", options.lr, 0.0, 1e6);
  config.schedule.kind = nn::parse_schedule_kind(options.schedule);
  config.schedule.warmup_steps = integer_option(
      "--warmup", options.warmup.empty() ? (gpt ? kGptWarmup : "0") : options.warmup, 0, kMaxCount);
  config.weight_decay = real_option("--weight-decay", options.weight_decay, 0.0, 1e6);
  config.momentum = real_option("--momentum", options.momentum, 0.0, 1.0);
  config.mode = comm::parse_reduction_mode(options.mode);
  config.seed = seed_option("--seed", options.seed);
  config.clip_grad_norm = real_option("--clip-grad-norm", options.clip_grad_norm, 0.0, 1e6);
  config.verify_generator = options.verify_generator;
  parse_trainer_layout({options.strategy, options.mesh, options.names, options.sequence_parallel},
                       config);
  // A pipeline's default: two micro-batches per stage rank (1F1B's bubble at most 1/3).
  const std::int64_t pipeline_ranks = config.mesh.given ? config.mesh.pp : 1;
  config.micro_batches = integer_option(
      "--micro-batches",
      options.micro_batches.empty()
          ? std::to_string(
                pipeline_ranks > 1 ? std::min<std::int64_t>(2 * pipeline_ranks, config.batch) : 1)
          : options.micro_batches,
      1, 1 << 21);
  if (options.reshard_after_forward && options.no_reshard_after_forward)
    throw ParseError("--reshard-after-forward and --no-reshard-after-forward exclude each other");
  config.reshard_after_forward = !options.no_reshard_after_forward;
  config.prefetch = static_cast<int>(integer_option("--prefetch", options.prefetch, 0, 64));
  config.param_dtype = parse_dtype(options.param_dtype);
  config.reduce_dtype = parse_dtype(options.reduce_dtype);
  for (const auto& [name, dtype] :
       {std::pair{"--param-dtype", config.param_dtype}, {"--reduce-dtype", config.reduce_dtype}}) {
    if (dtype != DType::f32 && dtype != DType::bf16 && dtype != DType::f16) {
      throw ParseError(fmt::format("{} {} is not one of f32, bf16, f16", name, dtype_name(dtype)));
    }
  }
  if (config.mode == comm::ReductionMode::exact && config.reduce_dtype != DType::f32) {
    throw ParseError(
        fmt::format("--reduce-dtype {} with --mode exact: exact mode reduces "
                    "gradients exactly (use ordered or native)",
                    options.reduce_dtype));
  }
  config.micro_batch_mode = train::parse_micro_batch_mode(options.micro_batch_mode);
  config.trace = !options.trace.empty();
  config.save_dir = options.save;
  config.resume_dir = options.resume;
  config.save_every = integer_option("--save-every", options.save_every, 0, kMaxCount);
  config.keep_checkpoints =
      static_cast<int>(integer_option("--keep-checkpoints", options.keep_checkpoints, 0, 1 << 20));
  if (options.save.empty() && (config.save_every > 0 || config.keep_checkpoints > 0))
    throw ParseError("--save-every and --keep-checkpoints need --save DIR");
  // --stop-after counts what the run's length counts: steps with --steps, else epochs.
  const std::int64_t stop_after = integer_option("--stop-after", options.stop_after, 0, kMaxCount);
  (config.steps > 0 ? config.stop_after : config.stop_after_epochs) = stop_after;
  return config;
}

/// Parses --model (with --activation and --layernorm for an MLP) and loads its data: --data, or
/// the model's default (Fashion-MNIST for mlp, Debian's fortunes for gpt).
LoadedTask load_task(const TrainOptions& options) {
  LoadedTask loaded;
  if (nn::is_gpt_model(options.model)) {
    const nn::GptConfig gpt = nn::parse_gpt_config(options.model);
    if ((options.activation_option != nullptr && options.activation_option->count() > 0) ||
        options.layernorm) {
      throw ParseError(fmt::format(
          "--activation and --layernorm shape an mlp; model {} has its own (GELU, pre-norm)",
          options.model));
    }
    loaded.data = options.data.empty() ? train::kDefaultTextDir : options.data;
    auto corpus = std::make_shared<const train::TextCorpus>(train::load_text(loaded.data));
    loaded.task = std::make_unique<train::LanguageModelling>(std::move(corpus), gpt);
    loaded.language = true;
    return loaded;
  }
  nn::MlpConfig mlp;
  mlp.hidden = nn::parse_mlp_hidden(options.model);
  mlp.activation = nn::parse_activation(options.activation);
  mlp.layernorm = options.layernorm;
  loaded.data = options.data.empty() ? train::kDefaultDataDir : options.data;
  loaded.images = std::make_unique<train::Dataset>(train::load_dataset(loaded.data));
  loaded.task = std::make_unique<train::ImageClassification>(*loaded.images, mlp);
  return loaded;
}

/// Registers the options `meshtensor train` and `meshtensor bench train` share, with the same
/// meaning and defaults.
void add_shared_train_options(CLI::App& command, TrainOptions& options) {
  command.add_option("--data", options.data,
                     "mlp: directory of the four IDX files (default Fashion-MNIST); gpt: a UTF-8 "
                     "text file or directory of them (default Debian's fortunes)");
  command.add_option("--model", options.model,
                     "mlp:H1,H2,... hidden sizes (default mlp:1024,1024), or gpt / "
                     "gpt:layers=L,heads=H,dim=D,context=T (any of the keys; default gpt:" +
                         nn::gpt_config_text(nn::GptConfig{}).substr(4) + ")");
  command.add_option(
      "--batch", options.batch,
      fmt::format("global batch: images, or text windows (default 256; gpt {})", kGptBatch));
  command.add_option("--optimizer", options.optimizer, "adamw or sgd (default adamw)");
  command.add_option("--lr", options.lr, "learning rate (default 1e-3)");
  command.add_option("--seed", options.seed, "seed of the initial weights and the data order");
  options.timeout.add_to(command);
}

void add_timed_train_options(CLI::App& command, TrainOptions& options, const std::string& steps) {
  options.steps = steps;
  add_shared_train_options(command, options);
  options.steps_option =
      command.add_option("--steps", options.steps, fmt::format("timed steps (default {})", steps));
  options.epochs_option = command.add_option("--epochs", options.epochs, "epochs instead of steps");
}

/// The median step time after the first two (which allocate and warm the caches).
double steady_median(const std::vector<double>& values, std::size_t warmup) {
  if (values.empty()) return 0.0;
  const auto skip = static_cast<std::ptrdiff_t>(std::min(warmup, values.size() - 1));
  return median(std::vector<double>(values.begin() + skip, values.end()));
}

double steady_step_seconds(const std::vector<double>& steps) {
  return steady_median(steps, 2);
}

namespace {

/// "784 inputs, relu" / "2.4 MB of text, ...": what the first line of a run names.
std::string describe_task(const LoadedTask& loaded) {
  if (loaded.language) {
    const auto& task = dynamic_cast<const train::LanguageModelling&>(*loaded.task);
    const train::TextCorpus& corpus = task.corpus();
    return fmt::format(
        "{} parameters; {} training and {} validation bytes from {} file(s), {} records",
        nn::gpt_parameter_count(task.model()), corpus.train.size(), corpus.validation.size(),
        corpus.files, corpus.records);
  }
  const auto& task = dynamic_cast<const train::ImageClassification&>(*loaded.task);
  return fmt::format("{}{}", task.model().activation == nn::Activation::gelu ? "gelu" : "relu",
                     task.model().layernorm ? ", layernorm" : "");
}

/// One line per report.
std::string report_line(const train::EpochReport& e, const LoadedTask& loaded) {
  if (loaded.language && loaded.task->eval_samples() == 0) {
    return fmt::format(
        "step {:>5}  train loss {:.4f}  no validation set  {:.0f} tokens/s  ({:.1f} s)", e.steps,
        e.train_loss, e.targets_per_second, e.seconds);
  }
  if (loaded.language) {
    return fmt::format(
        "step {:>5}  train loss {:.4f}  validation loss {:.4f}  validation acc {:.4f}  {:.0f} "
        "tokens/s  ({:.1f} s)",
        e.steps, e.train_loss, e.test_loss, e.test_accuracy, e.targets_per_second, e.seconds);
  }
  return fmt::format(
      "epoch {:>3}  train loss {:.4f}  train acc {:.4f}  test acc {:.4f}  {:.0f} samples/s  "
      "({:.1f} s)",
      e.epoch, e.train_loss, e.train_accuracy, e.test_accuracy, e.samples_per_second, e.seconds);
}

std::string format_duration(double seconds) {
  const auto total = static_cast<std::int64_t>(seconds + 0.5);
  return fmt::format("{}:{:02}", total / 60, total % 60);
}

/// The figures of a report as JSON: the evaluation's keys are named after the task's set
/// ("test_loss" for images, "validation_loss" for text).
/// Draws loss and accuracy per epoch (or per report, `by_steps`) into `png`.
void draw_plot(OutputFile& png, const std::vector<train::EpochReport>& epochs,
               const std::string& title, const std::string& eval_name, bool by_steps) {
  std::string data;
  for (const auto& e : epochs)
    data += fmt::format("{} {} {} {} {}\n", by_steps ? e.steps : e.epoch, e.train_loss,
                        e.train_accuracy, e.test_accuracy, e.test_loss);
  render_plot(png, data, [&](const std::string& data_path) {
    return fmt::format(
        "set title '{}'\n"
        "set xlabel '{}'\n"
        "set ylabel 'loss (nats)'\n"
        "set y2label 'accuracy'\n"
        "set ytics nomirror\n"
        "set y2tics\n"
        "set grid\n"
        "set key center right\n"
        "plot '{}' using 1:2 with linespoints title 'train loss' axes x1y1, "
        "'' using 1:5 with linespoints title '{} loss' axes x1y1, "
        "'' using 1:3 with linespoints title 'train accuracy' axes x1y2, "
        "'' using 1:4 with linespoints title '{} accuracy' axes x1y2\n",
        plot_safe(title), by_steps ? "step" : "epoch", data_path, plot_safe(eval_name),
        plot_safe(eval_name));
  });
}

/// The files the run writes, created (as temporaries) after every input was checked.
struct RunOutputs {
  std::unique_ptr<OutputFile> trace;
  std::unique_ptr<OutputFile> log;
  std::unique_ptr<OutputFile> plot;
};

/// Refuses outputs that are inputs, then creates the output files' temporaries.
RunOutputs open_outputs(const TrainOptions& options, const std::string& data) {
  const NamedPath outputs[] = {
      {"--trace", options.trace}, {"--log", options.log}, {"--plot", options.plot}};
  const NamedPath roots[] = {{"--save", options.save}};
  const NamedPath inputs[] = {{"--data", data}, {"--resume", options.resume}};
  check_outputs_are_not_inputs(outputs, roots, inputs);
  RunOutputs files;
  if (!options.trace.empty()) files.trace = std::make_unique<OutputFile>("--trace", options.trace);
  if (!options.log.empty()) files.log = std::make_unique<OutputFile>("--log", options.log);
  if (!options.plot.empty())
    files.plot = std::make_unique<OutputFile>("--plot", options.plot, /*binary=*/true);
  return files;
}

/// The pipeline's stages and bubble, and every rank's activation peak.
void print_pipeline(const train::TrainResult& result, const std::string& checkpointing) {
  if (result.pipeline.stages > 0) {
    const auto& p = result.pipeline;
    std::cout << fmt::format(
        "pipeline: {} stages, {} schedule, {} micro-batches; bubble of rank 0 {:.3f} (theory "
        "{:.3f})\n",
        p.stages, p.schedule, p.micro_batches, steady_median(p.step_bubbles, 1),
        p.theoretical_bubble);
    for (std::size_t s = 0; s < p.stage_units.size(); ++s)
      std::cout << fmt::format("  stage {}: {}\n", s, p.stage_units[s]);
  }
  std::vector<std::string> peaks;
  for (const std::int64_t bytes : result.activation_peaks)
    peaks.push_back(format_bytes(static_cast<double>(bytes)));
  std::cout << fmt::format("activation memory peak per rank (checkpointing {}): {}\n",
                           checkpointing, fmt::join(peaks, ", "));
}

/// What every rank must agree on before training: the run's settings as one line.
std::string run_fingerprint(const TrainOptions& options, const train::TrainConfig& config,
                            const std::string& data) {
  return fmt::format(
             "train data={} model={} activation={} layernorm={} epochs={} steps={} batch={} "
             "micro={} "
             "optimizer={} lr={} wd={} momentum={} warmup={} schedule={} mode={} seed={} "
             "strategy={} "
             "replicas={} reshard={} prefetch={} param={} reduce={} micro_mode={} trace={} save={} "
             "save_every={} keep={} resume={} stop_after={},{} eval_every={}",
             data, options.model, options.activation, options.layernorm, config.epochs,
             config.steps, config.batch, config.micro_batches, options.optimizer, options.lr,
             options.weight_decay, options.momentum, config.schedule.warmup_steps, options.schedule,
             options.mode, config.seed, static_cast<int>(config.strategy), config.replicas,
             config.reshard_after_forward, config.prefetch, options.param_dtype,
             options.reduce_dtype, options.micro_batch_mode, config.trace, config.save_dir,
             config.save_every, config.keep_checkpoints, config.resume_dir, config.stop_after,
             config.stop_after_epochs, config.eval_every) +
         fmt::format(" pipeline={} virtual={} checkpointing={}", options.pipeline_schedule,
                     config.virtual_stages, options.activation_checkpointing);
}

/// The progress bar (on a terminal), the per-epoch lines or JSON, and the CSV log.
train::TrainCallbacks progress_callbacks(const TrainOptions& options, const LoadedTask& loaded,
                                         bool terminal, std::ofstream* log) {
  const train::Task* task = loaded.task.get();  // outlives the run, like `options` and `loaded`
  train::TrainCallbacks callbacks;
  callbacks.on_step = [task, terminal](const train::StepProgress& p) {
    if (!terminal) return;
    constexpr int kWidth = 30;
    const auto filled =
        static_cast<int>(kWidth * p.samples_done / std::max<std::int64_t>(1, p.samples_total));
    const auto per_sample = static_cast<double>(task->targets_per_sample());
    std::cout << fmt::format("\repoch {:>3} [{}{}] {:>6}/{} {:>7.0f} {}s/s loss {:.4f} ETA {}  ",
                             p.epoch, std::string(static_cast<std::size_t>(filled), '#'),
                             std::string(static_cast<std::size_t>(kWidth - filled), ' '),
                             p.samples_done, p.samples_total, p.samples_per_second * per_sample,
                             task->target_name(), p.loss, format_duration(p.eta_seconds));
    std::cout.flush();
  };
  callbacks.on_epoch = [&options, &loaded, task, terminal, log](const train::EpochReport& e) {
    if (options.json) {
      std::cout << train::epoch_json(e, *task).dump() << '\n';
    } else {
      if (terminal) std::cout << '\r' << std::string(100, ' ') << '\r';
      std::cout << report_line(e, loaded) << '\n';
    }
    std::cout.flush();
    if (log) {
      *log << fmt::format("{},{},{},{},{},{},{},{}{}\n", e.epoch, e.steps, e.train_loss,
                          e.train_accuracy, e.test_loss, e.test_accuracy, e.samples_per_second,
                          loaded.language ? fmt::format("{},", e.targets_per_second) : "",
                          e.seconds);
      log->flush();
    }
  };
  return callbacks;
}

/// The end of a run in words: resume, checkpoints, evaluation, sample, memory, digests.
void print_result_text(const train::TrainResult& result, const TrainOptions& options,
                       const train::TrainConfig& config, const LoadedTask& loaded,
                       std::int64_t ranks, bool traced) {
  const std::string eval = loaded.task->eval_name();
  if (!config.resume_dir.empty()) {
    std::cout << fmt::format("resumed from {} at step {}{}\n", config.resume_dir,
                             result.resumed_step,
                             result.resumed_step == result.steps
                                 ? " (nothing left: give the whole run's --epochs or --steps)"
                                 : "");
  }
  if (!result.checkpoints.empty()) {
    std::cout << fmt::format("saved {} checkpoint(s), the last {}\n", result.checkpoints.size(),
                             result.checkpoints.back());
  }
  if (result.evaluated) {
    std::cout << fmt::format("{} loss {:.4f}, accuracy {:.4f} after {} steps ({:.1f} s)\n", eval,
                             result.test_loss, result.test_accuracy, result.steps, result.seconds);
  } else {
    std::cout << fmt::format("no {} set; {} steps ({:.1f} s)\n", eval, result.steps,
                             result.seconds);
  }
  if (loaded.language) {
    std::cout << fmt::format("sample (temperature {}):\n", train::kSampleTemperature)
              << train::printable_text(result.sample) << "\n-- end of sample\n";
  }
  const auto kind = [&](fsdp::MemoryKind k) {
    return format_bytes(static_cast<double>(result.memory_peak.of(k)));
  };
  std::cout << fmt::format(
      "peak memory of rank 0: {} (parameters {}, gradients {}, optimizer {}, unsharded {}) "
      "on mesh {}\n",
      format_bytes(static_cast<double>(result.memory_peak.total())),
      kind(fsdp::MemoryKind::parameters), kind(fsdp::MemoryKind::gradients),
      kind(fsdp::MemoryKind::optimizer_state), kind(fsdp::MemoryKind::unsharded), result.mesh);
  print_pipeline(result, options.activation_checkpointing);
  std::cout << fmt::format(
      "weights digest {} ({} parameters in {} tensors; replicas {} "
      "on {} ranks)\n",
      digest_hex(result.digest), result.parameters, result.parameter_tensors,
      result.replicas_identical ? "identical" : "DIFFER", ranks);
  if (result.evaluated) {
    std::cout << fmt::format("logits digest {} (the first evaluation windows)\n",
                             digest_hex(result.logits_digest));
  }
  if (options.verify_generator && result.evaluated) {
    const auto& check = result.generator_check;
    std::cout << fmt::format(
        "generator check: {} tokens generated on 1 rank, scored by the trainer on this "
        "layout: {} with the same log-probability bits, largest difference {:.3g}\n",
        check.tokens, check.identical, check.largest_difference);
  }
  if (options.explain_parallelism) {
    std::cout << "tensor-parallel plan:\n";
    for (const auto& [module, style] : result.parallel_plan)
      std::cout << fmt::format("  {:<22} {}\n", module, style);
    std::cout << "tensor-parallel collectives of the first step (rank 0):\n" << result.parallel_log;
  }
  if (traced) std::cout << fmt::format("trace written to {}\n", options.trace);
}

void run_train(const TrainOptions& options) {
  train::TrainConfig config = parse_config(options);
  const Backend backend = parse_backend(options.backend);
  const std::int64_t ranks = layout_ranks(options.ranks, options.ranks_option, options.mesh);
  if (!options.link.empty() && backend == Backend::mpi)
    throw ParseError("--link simulates a network on the threads backend; mpi has a real one");
  TopologyOptions topology = options.topology;
  topology.link = options.link;
  topology.check_backend(backend == Backend::mpi);
  comm::SimulatedNetwork network = topology.network(ranks);
  options.timeout.apply();
  const LoadedTask loaded = load_task(options);
  const train::Task& task = *loaded.task;
  train::validate_config(config, task);
  train::require_training_memory(config, task, backend == Backend::threads ? ranks : 1, ranks);
  RunOutputs outputs = open_outputs(options, loaded.data);
  OutputFile* const trace_file = outputs.trace.get();
  OutputFile* const plot = outputs.plot.get();
  std::ofstream* const log = outputs.log ? &outputs.log->stream() : nullptr;
  const std::string command = run_fingerprint(options, config, loaded.data);
  const bool terminal = isatty(STDOUT_FILENO) != 0 && !options.json;
  const std::string eval = task.eval_name();
  if (log) {
    *log << fmt::format(
        "epoch,steps,train_loss,train_accuracy,{0}_loss,{0}_accuracy,samples_per_second,{1}"
        "seconds\n",
        eval, loaded.language ? "tokens_per_second," : "");
  }

  run_ranks(
      backend, ranks, command,
      [&](comm::Communicator& world) {
        const bool leader = world.rank() == 0;
        if (backend == Backend::mpi && options.ranks_option->count() > 0 && world.size() != ranks) {
          throw InvalidArgument(
              fmt::format("--ranks {} does not match the mpi job's {} ranks", ranks, world.size()));
        }
        if (leader && !options.json) {
          std::cout << fmt::format(
              "training {} ({}) on {} {} rank(s), {}, mode {}, global batch {}, {} "
              "micro-batch(es) per rank, {}\n",
              options.model, describe_task(loaded), world.size(),
              backend == Backend::threads ? "threads" : "mpi",
              options.strategy.empty() ? (options.mesh.empty() ? "ddp" : "hsdp") : options.strategy,
              options.mode, config.batch, config.micro_batches, loaded.data);
          std::cout.flush();
        }
        const train::TrainCallbacks callbacks = progress_callbacks(options, loaded, terminal, log);
        const train::TrainResult result = train::train(world, task, config, callbacks);
        if (!leader) return;
        for (const std::string& warning : result.warnings)
          std::cerr << "meshtensor: warning: " << with_flag_names(warning) << '\n';
        if (trace_file) {
          trace_file->stream() << result.trace << '\n';
          trace_file->commit();
        }
        if (log) outputs.log->commit();
        if (options.json) {
          nlohmann::json final_json = train::result_json(result, task, config, world.size());
          for (auto& warning : final_json["warnings"])
            warning = with_flag_names(warning.get<std::string>());
          std::cout << final_json.dump() << '\n';
        } else {
          print_result_text(result, options, config, loaded, world.size(), trace_file != nullptr);
        }
        std::cout.flush();
        if (plot) {
          draw_plot(*plot, result.epochs,
                    fmt::format("meshtensor train {} on {} ranks, mode {}", options.model,
                                world.size(), options.mode),
                    eval, loaded.language || config.eval_every > 0);
        }
        if (!result.replicas_identical && config.mode != comm::ReductionMode::native)
          set_exit_status(1);
      },
      std::move(network));
}

/// `meshtensor bench train`: the options of `meshtensor train` it shares (and so its defaults),
/// and the exact-mode layouts.
struct TrainBenchOptions {
  TrainOptions train;
  std::string layouts;
  std::string rounds = "3";
};

/// One data-parallel layout: ranks, and micro-batches per rank.
struct Layout {
  std::int64_t ranks = 1;
  std::int64_t micro_batches = 1;
};

/// "4" or "3x2" (3 ranks of 2 micro-batches each), comma-separated.
std::vector<Layout> parse_layouts(const std::string& text) {
  std::vector<Layout> layouts;
  for (const std::string& entry : list_option("--layouts", text)) {
    const auto cross = entry.find('x');
    Layout layout;
    const std::string option = fmt::format("--layouts {}", entry);
    layout.ranks = integer_option(option, entry.substr(0, cross), 1, comm::kMaxThreadsRanks);
    if (cross != std::string::npos)
      layout.micro_batches = integer_option(option, entry.substr(cross + 1), 1, 1 << 21);
    layouts.push_back(layout);
  }
  return layouts;
}

struct TrainBenchRun {
  std::string mode;
  Layout layout;
  double samples_per_second = 0.0;
  double step_seconds = 0.0;  // median over the steps after the first two
  double test_accuracy = 0.0;
  double test_loss = 0.0;
  std::uint64_t digest = 0;
  bool replicas_identical = false;
};

TrainBenchRun time_training(const train::Task& task, train::TrainConfig config, Layout layout) {
  config.micro_batches = layout.micro_batches;
  TrainBenchRun run;
  run.mode = std::string(comm::reduction_mode_name(config.mode));
  run.layout = layout;
  const std::string command =
      fmt::format("bench train {} ranks={} micro={}", run.mode, layout.ranks, layout.micro_batches);
  run_ranks(Backend::threads, layout.ranks, command, [&](comm::Communicator& world) {
    const train::TrainResult result = train::train(world, task, config, {});
    if (world.rank() != 0) return;
    double seconds = 0.0;
    std::int64_t samples = 0;
    for (const train::EpochReport& e : result.epochs) {
      seconds += e.seconds;
      samples += e.samples;
    }
    run.samples_per_second = seconds > 0 ? static_cast<double>(samples) / seconds : 0.0;
    run.step_seconds = steady_step_seconds(result.step_seconds);  // one slow step moves it not
    run.test_accuracy = result.test_accuracy;
    run.test_loss = result.test_loss;
    run.digest = result.digest;
    run.replicas_identical = result.replicas_identical;
  });
  return run;
}

/// One row for repeated runs of one mode and layout: the first run with the median step time and
/// throughput of all; `agree` turns false when a rerun ended on other bits.
TrainBenchRun combine_rounds(const std::vector<TrainBenchRun>& rounds, bool& agree) {
  TrainBenchRun combined = rounds.front();
  std::vector<double> steps;
  std::vector<double> throughputs;
  for (const TrainBenchRun& run : rounds) {
    steps.push_back(run.step_seconds);
    throughputs.push_back(run.samples_per_second);
    agree = agree && run.digest == combined.digest;
    combined.replicas_identical = combined.replicas_identical && run.replicas_identical;
  }
  combined.step_seconds = median(steps);
  combined.samples_per_second = median(throughputs);
  return combined;
}

/// The timed runs of `bench train` as JSON rows.
nlohmann::json train_bench_rows(const std::vector<TrainBenchRun>& runs, const LoadedTask& loaded) {
  const train::Task& task = *loaded.task;
  nlohmann::json rows = nlohmann::json::array();
  const std::string eval = task.eval_name();
  for (const TrainBenchRun& r : runs) {
    nlohmann::json row = {{"mode", r.mode},
                          {"ranks", r.layout.ranks},
                          {"micro_batches", r.layout.micro_batches},
                          {"samples_per_second", r.samples_per_second},
                          {"step_seconds", r.step_seconds},
                          {eval + "_loss", r.test_loss},
                          {eval + "_accuracy", r.test_accuracy},
                          {"digest", digest_hex(r.digest)},
                          {"replicas_identical", r.replicas_identical}};
    if (loaded.language) {
      row["tokens_per_second"] =
          r.samples_per_second * static_cast<double>(task.targets_per_sample());
    }
    rows.push_back(row);
  }
  return rows;
}

/// The timed runs of `bench train` as a table.
void print_train_bench_rows(const std::vector<TrainBenchRun>& runs, const train::Task& task) {
  const auto per_sample = static_cast<double>(task.targets_per_sample());
  std::cout << fmt::format("{:<8} {:>5} {:>6} {:>10} {:>9} {:>9} {:>9}  {}\n", "mode", "ranks",
                           "micro", fmt::format("{}s/s", task.target_name()), "step ms",
                           task.eval_name().substr(0, 4) + " loss", "acc", "digest");
  for (const TrainBenchRun& r : runs) {
    std::cout << fmt::format("{:<8} {:>5} {:>6} {:>10.0f} {:>9.1f} {:>9.4f} {:>9.4f}  {}{}\n",
                             r.mode, r.layout.ranks, r.layout.micro_batches,
                             r.samples_per_second * per_sample, r.step_seconds * 1e3, r.test_loss,
                             r.test_accuracy, digest_hex(r.digest),
                             r.replicas_identical ? "" : "  (replicas DIFFER)");
  }
}

void run_train_bench(const TrainBenchOptions& options) {
  print_machine_line(options.train.json);
  TrainOptions train_options = options.train;
  // Steps unless epochs are given (`meshtensor train` counts epochs unless steps are given).
  if (train_options.epochs_option->count() > 0 && train_options.steps_option->count() == 0)
    train_options.steps = "0";
  train::TrainConfig config = parse_config(train_options);
  const std::int64_t ranks =
      integer_option("--ranks", train_options.ranks, 1, comm::kMaxThreadsRanks);
  std::vector<Layout> layouts{Layout{ranks, 1}};
  if (!options.layouts.empty()) layouts = parse_layouts(options.layouts);
  const std::int64_t rounds = integer_option("--rounds", options.rounds, 1, 100);
  train_options.timeout.apply();
  config.sample = false;
  const LoadedTask loaded = load_task(train_options);
  const train::Task& task = *loaded.task;
  train::TrainConfig largest = config;
  largest.mode = comm::ReductionMode::exact;
  for (const Layout& layout : layouts) {
    largest.micro_batches = layout.micro_batches;
    train::validate_config(largest, task);  // every layout refused before any run is timed
    train::require_training_memory(largest, task, layout.ranks, layout.ranks);
  }
  train::require_training_memory(largest, task, ranks, ranks);

  // Ordered and exact runs on --ranks alternate, so that the host's load lands on both modes:
  // the ratio is the median of the rounds' ratios.
  const Layout compared{ranks, 1};
  std::vector<TrainBenchRun> ordered_rounds;
  std::vector<TrainBenchRun> exact_rounds;
  std::vector<double> ratios;
  for (std::int64_t round = 0; round < rounds; ++round) {
    config.mode = comm::ReductionMode::ordered;
    ordered_rounds.push_back(time_training(task, config, compared));
    config.mode = comm::ReductionMode::exact;
    exact_rounds.push_back(time_training(task, config, compared));
    ratios.push_back(exact_rounds.back().step_seconds / ordered_rounds.back().step_seconds);
  }
  const double ratio = median(ratios);
  bool reruns_agree = true;
  std::vector<TrainBenchRun> runs{combine_rounds(ordered_rounds, reruns_agree)};
  for (const Layout& layout : layouts) {
    if (layout.ranks == compared.ranks && layout.micro_batches == compared.micro_batches) {
      runs.push_back(combine_rounds(exact_rounds, reruns_agree));
    } else {
      runs.push_back(time_training(task, config, layout));
    }
  }
  bool digests_agree = true;
  bool replicas_agree = true;
  for (const TrainBenchRun& r : runs) {
    replicas_agree = replicas_agree && r.replicas_identical;
    if (r.mode == "exact") digests_agree = digests_agree && r.digest == runs[1].digest;
  }
  if (train_options.json) {
    nlohmann::json out = {
        {"model", train_options.model},           {"batch", config.batch},
        {"runs", train_bench_rows(runs, loaded)}, {"exact_digests_identical", digests_agree},
        {"reruns_identical", reruns_agree},       {"exact_over_ordered_step_time", ratio},
        {"exact_over_ordered_rounds", ratios}};
    std::cout << out.dump(2) << '\n';
  } else {
    std::cout << fmt::format("training {} (global batch {}, {}) on threads\n", train_options.model,
                             config.batch,
                             config.steps > 0 ? fmt::format("{} steps", config.steps)
                                              : fmt::format("{} epochs", config.epochs));
    print_train_bench_rows(runs, task);
    std::cout << fmt::format(
        "exact / ordered step time on {} ranks: {:.2f}x, median of {} alternated rounds ({:.2f}) "
        "(goal: at most 3x)\n",
        ranks, ratio, rounds, fmt::join(ratios, ", "));
    std::cout << fmt::format("reruns of each mode: {}\n", reruns_agree ? "identical" : "DIFFER");
    std::cout << fmt::format("exact digests over {} layout(s): {}\n", layouts.size(),
                             digests_agree ? "identical" : "DIFFER");
  }
  if (!digests_agree || !replicas_agree || !reruns_agree) set_exit_status(1);
}

/// `meshtensor bench fsdp`: the shared train options, the simulated link and the exact layouts.
struct FsdpBenchOptions {
  TrainOptions train;
  std::string link = "20us,10";
  std::string exact_steps = "3";
  std::string hsdp_replicas = "2";  // the replicas of the topology runs' hsdp layout
  TopologyOptions topology;         // --ranks-per-host: the topology runs
};

/// One timed training run of the fsdp bench, as world rank 0 saw it.
struct FsdpBenchRun {
  std::string name;
  double step_seconds = 0.0;  // median over the steps after the first two
  double wait_seconds = 0.0;  // median compute wait per step
  double link_seconds = 0.0;  // per rank and step: what the link charged for its collectives
  std::int64_t peak_bytes = 0;
  std::int64_t sharded_bytes = 0;  // parameters + gradients + optimizer state
  std::uint64_t digest = 0;
  bool replicas_identical = false;
  std::map<std::string, std::int64_t> collectives;  // tensor-parallel, first step, by phase+kind
};

/// One training run on `world_size` thread ranks, as world rank 0 saw it. With `link`, the
/// simulated link charges each collective; link_seconds is the charge per rank and step over the
/// steps alone (the evaluation and digests after the last step are not counted).
FsdpBenchRun measure_training(const train::Task& task, const std::string& name,
                              const train::TrainConfig& config, std::int64_t world_size,
                              const comm::LinkDelay& link, const Topology& topology = {}) {
  FsdpBenchRun run;
  run.name = name;
  std::atomic<std::int64_t> charged_ns{0};
  std::atomic<std::int64_t> charged_by_steps{0};
  const comm::LinkDelay counted = [&](const comm::CollectiveCall& call,
                                      const std::vector<std::int64_t>& group) {
    const std::chrono::nanoseconds delay = link(call, group);
    charged_ns += delay.count();
    return delay;
  };
  train::TrainCallbacks callbacks;
  callbacks.on_step = [&](const train::StepProgress&) { charged_by_steps = charged_ns.load(); };
  run_ranks(
      Backend::threads, world_size, "bench",
      [&](comm::Communicator& world) {
        const train::TrainResult result = train::train(world, task, config, callbacks);
        if (world.rank() != 0) return;
        const auto skip = std::min<std::size_t>(2, result.step_seconds.size() - 1);
        run.step_seconds = steady_step_seconds(result.step_seconds);
        run.wait_seconds = median(std::vector<double>(result.step_wait_seconds.begin() + skip,
                                                      result.step_wait_seconds.end()));
        run.peak_bytes = result.memory_peak.total();
        run.sharded_bytes = result.memory_peak_by_kind.of(fsdp::MemoryKind::parameters) +
                            result.memory_peak_by_kind.of(fsdp::MemoryKind::gradients) +
                            result.memory_peak_by_kind.of(fsdp::MemoryKind::optimizer_state);
        run.digest = result.digest;
        run.replicas_identical = result.replicas_identical;
        run.collectives = result.parallel_collectives;
      },
      comm::SimulatedNetwork(link ? counted : comm::LinkDelay(), topology));
  run.link_seconds = static_cast<double>(charged_by_steps.load()) * 1e-9 /
                     static_cast<double>(world_size) / static_cast<double>(config.steps);
  return run;
}

/// The topology of a bench's --ranks-per-host and links (--link the one inside a domain).
Topology bench_topology(const TopologyOptions& given, const std::string& link, std::int64_t ranks) {
  TopologyOptions options = given;
  options.link = link;
  return options.topology(ranks);
}

/// One layout on simulated hosts: the same links charged per level, the ranks knowing their
/// topology (collectives in two levels where cheaper) or not.
struct TopologyPair {
  FsdpBenchRun aware;
  FsdpBenchRun blind;
  double speedup() const { return blind.step_seconds / aware.step_seconds; }
};

TopologyPair measure_on_hosts(const train::Task& task, const std::string& name,
                              const train::TrainConfig& config, std::int64_t world_size,
                              const Topology& topology) {
  const comm::LinkDelay link = comm::simulated_topology_link(topology);
  TopologyPair pair;
  // Alternated, medians of each run's steps: the machine's speed drifts.
  pair.blind = measure_training(task, name + ", topology-blind", config, world_size, link);
  pair.aware =
      measure_training(task, name + ", topology-aware", config, world_size, link, topology);
  return pair;
}

void print_topology_pairs(const std::vector<TopologyPair>& pairs, const Topology& topology,
                          bool json, nlohmann::json* out) {
  if (pairs.empty()) return;
  if (json) {
    nlohmann::json list = nlohmann::json::array();
    for (const TopologyPair& pair : pairs) {
      list.push_back({{"layout", pair.aware.name},
                      {"aware_step_ms", pair.aware.step_seconds * 1e3},
                      {"blind_step_ms", pair.blind.step_seconds * 1e3},
                      {"aware_link_ms_per_step", pair.aware.link_seconds * 1e3},
                      {"blind_link_ms_per_step", pair.blind.link_seconds * 1e3},
                      {"blind_over_aware", pair.speedup()},
                      {"replicas_identical", pair.aware.replicas_identical}});
    }
    (*out)["topology"] = {{"description", topology.to_string()}, {"runs", list}};
    return;
  }
  std::cout << fmt::format("on simulated hosts: {}\n", topology.to_string());
  for (const TopologyPair& pair : pairs) {
    std::cout << fmt::format(
        "  {:<44} step {:>8.2f} ms (link {:>7.2f} ms/step) against blind {:>8.2f} ms (link "
        "{:>7.2f}): {:.2f}x\n",
        pair.aware.name, pair.aware.step_seconds * 1e3, pair.aware.link_seconds * 1e3,
        pair.blind.step_seconds * 1e3, pair.blind.link_seconds * 1e3, pair.speedup());
  }
}

// Exposed communication: the compute thread's extra wait per step once the link charges time,
// over the link time the step's collectives take (the measure does not depend on how fast this
// machine computes). The step-time difference is beside it.
double exposed(const FsdpBenchRun& compute, const FsdpBenchRun& linked) {
  return linked.link_seconds > 0
             ? std::max(0.0, linked.wait_seconds - compute.wait_seconds) / linked.link_seconds
             : 0.0;
}
double exposed_by_step(const FsdpBenchRun& compute, const FsdpBenchRun& linked) {
  return linked.link_seconds > 0
             ? std::max(0.0, linked.step_seconds - compute.step_seconds) / linked.link_seconds
             : 0.0;
}

/// Everything `bench fsdp` measured.
struct FsdpBenchFigures {
  std::int64_t ranks = 0;
  std::int64_t steps = 0;
  std::int64_t batch = 0;
  FsdpBenchRun fsdp_compute, fsdp_linked, bare_compute, bare_linked, ddp_compute, ddp_linked;
  std::vector<TopologyPair> on_hosts;
  std::vector<FsdpBenchRun> exact_runs;
  bool digests_agree = true;
  bool replicas_agree = true;
  double fsdp_over_ddp() const { return fsdp_linked.step_seconds / ddp_linked.step_seconds; }
};

/// Exact mode over DDP, FSDP, HSDP and micro-batch layouts and 1 rank: one digest expected.
std::vector<FsdpBenchRun> exact_layout_runs(const train::Task& task, train::TrainConfig exact,
                                            std::int64_t steps) {
  std::vector<FsdpBenchRun> runs;
  exact.mode = comm::ReductionMode::exact;
  exact.steps = steps;
  using train::MicroBatchMode;
  using train::Strategy;
  const auto layout = [&](const std::string& name, Strategy strategy, std::int64_t world_size,
                          std::int64_t replicas, std::int64_t micro, MicroBatchMode mode) {
    train::TrainConfig config = exact;
    config.strategy = strategy;
    config.replicas = replicas;
    config.micro_batches = micro;
    config.micro_batch_mode = mode;
    runs.push_back(measure_training(task, name, config, world_size, comm::LinkDelay()));
  };
  layout("ddp 8", Strategy::ddp, 8, 0, 1, MicroBatchMode::no_sync);
  layout("fsdp 8", Strategy::fsdp, 8, 0, 1, MicroBatchMode::no_sync);
  layout("hsdp 2x4", Strategy::hsdp, 8, 2, 1, MicroBatchMode::no_sync);
  layout("hsdp 4x2, 4 micro-batches (no-sync)", Strategy::hsdp, 8, 4, 4, MicroBatchMode::no_sync);
  layout("hsdp 4x2, 4 micro-batches (reduce-scatter)", Strategy::hsdp, 8, 4, 4,
         MicroBatchMode::reduce_scatter);
  layout("1 rank", Strategy::fsdp, 1, 0, 1, MicroBatchMode::no_sync);
  return runs;
}

void print_fsdp_json(const FsdpBenchFigures& f, const FsdpBenchOptions& options,
                     const Topology& hosts) {
  nlohmann::json out = {
      {"ranks", f.ranks},
      {"link", options.link},
      {"steps", f.steps},
      {"link_ms_per_step", f.fsdp_linked.link_seconds * 1e3},
      {"exposed_communication_prefetch", exposed(f.fsdp_compute, f.fsdp_linked)},
      {"exposed_communication_no_prefetch", exposed(f.bare_compute, f.bare_linked)},
      {"exposed_by_step_time_prefetch", exposed_by_step(f.fsdp_compute, f.fsdp_linked)},
      {"exposed_by_step_time_no_prefetch", exposed_by_step(f.bare_compute, f.bare_linked)},
      {"fsdp_step_ms", f.fsdp_linked.step_seconds * 1e3},
      {"ddp_step_ms", f.ddp_linked.step_seconds * 1e3},
      {"fsdp_over_ddp_step_time", f.fsdp_over_ddp()},
      {"fsdp_peak_bytes", f.fsdp_linked.peak_bytes},
      {"ddp_peak_bytes", f.ddp_linked.peak_bytes},
      {"fsdp_sharded_state_bytes", f.fsdp_linked.sharded_bytes},
      {"ddp_state_bytes", f.ddp_linked.sharded_bytes},
      {"ordered_replicas_identical", f.replicas_agree},
      {"exact_digests_identical", f.digests_agree}};
  nlohmann::json layouts = nlohmann::json::array();
  for (const FsdpBenchRun& r : f.exact_runs)
    layouts.push_back({{"layout", r.name}, {"digest", digest_hex(r.digest)}});
  out["exact_layouts"] = layouts;
  print_topology_pairs(f.on_hosts, hosts, true, &out);
  std::cout << out.dump() << '\n';
}

void print_fsdp_text(const FsdpBenchFigures& f, const FsdpBenchOptions& options,
                     const Topology& hosts) {
  std::cout << fmt::format(
      "fsdp bench: {} thread ranks, model {}, global batch {}, {} steps, simulated link {}\n",
      f.ranks, options.train.model, f.batch, f.steps, options.link);
  std::cout << fmt::format("{:<28} {:>10} {:>12} {:>12} {:>12}\n", "run", "step ms", "wait ms/step",
                           "link ms/step", "peak memory");
  for (const FsdpBenchRun* r : {&f.fsdp_compute, &f.fsdp_linked, &f.bare_compute, &f.bare_linked,
                                &f.ddp_compute, &f.ddp_linked}) {
    std::cout << fmt::format("{:<28} {:>10.2f} {:>12.2f} {:>12.2f} {:>12}\n", r->name,
                             r->step_seconds * 1e3, r->wait_seconds * 1e3, r->link_seconds * 1e3,
                             format_bytes(static_cast<double>(r->peak_bytes)));
  }
  std::cout << fmt::format(
      "exposed communication (extra compute wait / link time): {:.3f} with prefetch, {:.3f} "
      "without (goal <= 0.10 with prefetch)\n",
      exposed(f.fsdp_compute, f.fsdp_linked), exposed(f.bare_compute, f.bare_linked));
  std::cout << fmt::format(
      "exposed communication by step time ((step - compute-only step) / link time): {:.3f} "
      "with prefetch, {:.3f} without\n",
      exposed_by_step(f.fsdp_compute, f.fsdp_linked),
      exposed_by_step(f.bare_compute, f.bare_linked));
  std::cout << fmt::format("fsdp / ddp step time on the link: {:.3f} (goal <= 1.1)\n",
                           f.fsdp_over_ddp());
  std::cout << fmt::format(
      "peak memory per rank: fsdp {} against ddp {} ({:.2f}x); sharded state {} against {}\n",
      format_bytes(static_cast<double>(f.fsdp_linked.peak_bytes)),
      format_bytes(static_cast<double>(f.ddp_linked.peak_bytes)),
      static_cast<double>(f.fsdp_linked.peak_bytes) / static_cast<double>(f.ddp_linked.peak_bytes),
      format_bytes(static_cast<double>(f.fsdp_linked.sharded_bytes)),
      format_bytes(static_cast<double>(f.ddp_linked.sharded_bytes)));
  print_topology_pairs(f.on_hosts, hosts, false, nullptr);
  std::cout << fmt::format("ordered replicas identical: {}\n", f.replicas_agree ? "yes" : "NO");
  for (const FsdpBenchRun& r : f.exact_runs)
    std::cout << fmt::format("exact {:<44} digest {}\n", r.name, digest_hex(r.digest));
  if (!f.exact_runs.empty()) {
    std::cout << fmt::format("exact digests over {} layouts: {}\n", f.exact_runs.size(),
                             f.digests_agree ? "identical" : "DIFFER");
  }
}

void run_fsdp_bench(const FsdpBenchOptions& options) {
  print_machine_line(options.train.json);
  train::TrainConfig base = parse_config(options.train);
  base.sample = false;
  FsdpBenchFigures f;
  f.ranks = integer_option("--ranks", options.train.ranks, 1, comm::kMaxThreadsRanks);
  const std::int64_t exact_steps = integer_option("--exact-steps", options.exact_steps, 0, 1 << 20);
  const std::int64_t hsdp_replicas =
      integer_option("--hsdp-replicas", options.hsdp_replicas, 0, f.ranks);
  const comm::LinkDelay link = comm::parse_link(options.link);
  options.train.timeout.apply();
  const LoadedTask loaded = load_task(options.train);
  const train::Task& task = *loaded.task;
  train::TrainConfig largest = base;
  largest.mode = comm::ReductionMode::exact;
  largest.strategy = train::Strategy::ddp;  // the most memory of the layouts it runs
  train::validate_config(largest, task);
  train::require_training_memory(largest, task, f.ranks, f.ranks);
  // The topology options are checked before anything is measured.
  const Topology hosts = bench_topology(options.topology, options.link, f.ranks);

  const auto measure = [&](const std::string& name, const train::TrainConfig& config,
                           bool with_link) {
    return measure_training(task, name, config, f.ranks, with_link ? link : comm::LinkDelay());
  };
  train::TrainConfig fsdp_config = base;
  if (fsdp_config.steps == 0) fsdp_config.steps = 12;
  f.steps = fsdp_config.steps;
  f.batch = fsdp_config.batch;
  fsdp_config.strategy = train::Strategy::fsdp;
  train::TrainConfig ddp_config = fsdp_config;
  ddp_config.strategy = train::Strategy::ddp;
  train::TrainConfig no_prefetch = fsdp_config;
  no_prefetch.prefetch = 0;
  f.fsdp_compute = measure("fsdp, no link", fsdp_config, false);
  f.fsdp_linked = measure("fsdp, link", fsdp_config, true);
  f.bare_compute = measure("fsdp no prefetch, no link", no_prefetch, false);
  f.bare_linked = measure("fsdp no prefetch, link", no_prefetch, true);
  f.ddp_compute = measure("ddp, no link", ddp_config, false);
  f.ddp_linked = measure("ddp, link", ddp_config, true);
  if (options.topology.placed()) {
    f.on_hosts.push_back(measure_on_hosts(task, "fsdp", fsdp_config, f.ranks, hosts));
    if (hsdp_replicas > 1 && f.ranks % hsdp_replicas == 0) {
      train::TrainConfig hsdp = fsdp_config;
      hsdp.strategy = train::Strategy::hsdp;
      hsdp.replicas = hsdp_replicas;
      f.on_hosts.push_back(
          measure_on_hosts(task, fmt::format("hsdp {}x{}", hsdp_replicas, f.ranks / hsdp_replicas),
                           hsdp, f.ranks, hosts));
    }
  }
  if (exact_steps > 0) f.exact_runs = exact_layout_runs(task, base, exact_steps);
  for (const FsdpBenchRun& r : f.exact_runs)
    f.digests_agree = f.digests_agree && r.digest == f.exact_runs.front().digest;
  for (const FsdpBenchRun* r : {&f.fsdp_linked, &f.ddp_linked, &f.bare_linked})
    f.replicas_agree = f.replicas_agree && r->replicas_identical;
  for (const TopologyPair& pair : f.on_hosts) {
    f.replicas_agree =
        f.replicas_agree && pair.aware.replicas_identical && pair.blind.replicas_identical;
  }
  if (options.train.json) {
    print_fsdp_json(f, options, hosts);
  } else {
    print_fsdp_text(f, options, hosts);
  }
  if (!f.digests_agree || !f.replicas_agree) set_exit_status(1);
}

/// `meshtensor bench tp`: the shared train options, the simulated link, the exact rounds.
struct TpBenchOptions {
  TrainOptions train;
  std::string link = "20us,10";
  std::string rounds = "2";
  TopologyOptions topology;  // --ranks-per-host: the topology runs
};

/// A compute-only run and a run on the link of one layout.
struct LinkedPair {
  FsdpBenchRun compute;
  FsdpBenchRun linked;
  /// The step time the link adds, over the link time of the step's collectives.
  double exposed() const {
    return linked.link_seconds > 0
               ? std::max(0.0, linked.step_seconds - compute.step_seconds) / linked.link_seconds
               : 0.0;
  }
};

nlohmann::json pair_json(const LinkedPair& pair) {
  return {{"step_ms", pair.linked.step_seconds * 1e3},
          {"compute_step_ms", pair.compute.step_seconds * 1e3},
          {"link_ms_per_step", pair.linked.link_seconds * 1e3},
          {"exposed_communication", pair.exposed()},
          {"peak_bytes", pair.linked.peak_bytes},
          {"replicas_identical", pair.linked.replicas_identical},
          {"tp_collectives_first_step", pair.linked.collectives}};
}

void print_tp_bench(const TpBenchOptions& options, const std::vector<LinkedPair>& layouts,
                    double exact_ms, double ordered_ms, const std::vector<TopologyPair>& on_hosts,
                    const Topology& hosts) {
  const double tp_over_fsdp = layouts[1].linked.step_seconds / layouts[0].linked.step_seconds;
  const double exact_ratio = exact_ms / ordered_ms;
  if (options.train.json) {
    nlohmann::json out = {{"link", options.link},
                          {"fsdp_x_tp_over_fsdp_step_time", tp_over_fsdp},
                          {"exact_tp_step_ms", exact_ms},
                          {"ordered_tp_step_ms", ordered_ms},
                          {"exact_over_ordered_tp_step_time", exact_ratio}};
    for (const LinkedPair& pair : layouts)
      out["layouts"][pair.linked.name] = pair_json(pair);
    print_topology_pairs(on_hosts, hosts, true, &out);
    std::cout << out.dump() << '\n';
    return;
  }
  std::cout << fmt::format("{:<28} {:>9} {:>13} {:>12} {:>9} {:>12}\n", "layout (8 thread ranks)",
                           "step ms", "no-link ms", "link ms/step", "exposed", "peak memory");
  for (const LinkedPair& pair : layouts) {
    std::cout << fmt::format("{:<28} {:>9.2f} {:>13.2f} {:>12.2f} {:>9.3f} {:>12}\n",
                             pair.linked.name, pair.linked.step_seconds * 1e3,
                             pair.compute.step_seconds * 1e3, pair.linked.link_seconds * 1e3,
                             pair.exposed(),
                             format_bytes(static_cast<double>(pair.linked.peak_bytes)));
  }
  for (const LinkedPair& pair : layouts) {
    if (pair.linked.collectives.empty()) continue;
    std::string counts;
    for (const auto& [kind, n] : pair.linked.collectives)
      counts += fmt::format("{}{} {}", counts.empty() ? "" : ", ", n, kind);
    std::cout << fmt::format("tensor-parallel collectives of one step, {}: {}\n", pair.linked.name,
                             counts);
  }
  std::cout << fmt::format("fsdp x tp / fsdp step time on the link: {:.3f}\n", tp_over_fsdp);
  std::cout << fmt::format(
      "exact / ordered step time, tp 2 on 2 ranks, no link: {:.3f} ({:.1f} ms against {:.1f} ms; "
      "goal <= 3)\n",
      exact_ratio, exact_ms, ordered_ms);
  print_topology_pairs(on_hosts, hosts, false, nullptr);
}

void run_tp_bench(const TpBenchOptions& options) {
  print_machine_line(options.train.json);
  train::TrainConfig base = parse_config(options.train);
  base.sample = false;
  base.eval_every = 0;
  if (base.steps == 0) base.steps = 6;
  const std::int64_t rounds = integer_option("--rounds", options.rounds, 1, 100);
  const comm::LinkDelay link = comm::parse_link(options.link);
  options.train.timeout.apply();
  const LoadedTask loaded = load_task(options.train);
  const train::Task& task = *loaded.task;
  const auto layout = [&](const std::string& mesh, const std::string& names,
                          bool sequence_parallel) {
    train::TrainConfig config = base;
    config.mesh = train::parse_named_mesh(mesh, names);
    config.sequence_parallel = sequence_parallel;
    train::validate_config(config, task);
    task.check_tensor_parallel(config.mesh.tp);
    train::require_training_memory(config, task, config.mesh.ranks(), config.mesh.ranks());
    return config;
  };
  // The topology options are checked before anything is measured.
  const Topology hosts = bench_topology(options.topology, options.link, 8);
  std::vector<LinkedPair> layouts;
  for (const auto& [name, mesh, names, sp] :
       {std::tuple{"fsdp 8", "8", "fsdp", false},
        std::tuple{"fsdp x tp 4x2", "4x2", "fsdp,tp", false},
        std::tuple{"dp x fsdp x tp 2x2x2 + SP", "2x2x2", "dp,fsdp,tp", true}}) {
    const train::TrainConfig config = layout(mesh, names, sp);
    layouts.push_back({measure_training(task, name, config, 8, {}),
                       measure_training(task, name, config, 8, link)});
  }
  train::TrainConfig ordered = layout("2", "tp", false);
  train::TrainConfig exact = ordered;
  exact.mode = comm::ReductionMode::exact;
  std::vector<double> exact_ms;
  std::vector<double> ordered_ms;
  for (std::int64_t r = 0; r < rounds; ++r) {
    ordered_ms.push_back(measure_training(task, "ordered tp 2", ordered, 2, {}).step_seconds * 1e3);
    exact_ms.push_back(measure_training(task, "exact tp 2", exact, 2, {}).step_seconds * 1e3);
  }
  std::vector<TopologyPair> on_hosts;
  if (options.topology.placed()) {
    on_hosts.push_back(
        measure_on_hosts(task, "fsdp x tp 4x2", layout("4x2", "fsdp,tp", false), 8, hosts));
    on_hosts.push_back(measure_on_hosts(task, "dp x fsdp x tp 2x2x2 + SP",
                                        layout("2x2x2", "dp,fsdp,tp", true), 8, hosts));
  }
  print_tp_bench(options, layouts, median(exact_ms), median(ordered_ms), on_hosts, hosts);
  for (const LinkedPair& pair : layouts)
    if (!pair.linked.replicas_identical) set_exit_status(1);
  for (const TopologyPair& pair : on_hosts)
    if (!pair.aware.replicas_identical) set_exit_status(1);
}

}  // namespace

void add_train_bench(CLI::App& bench) {
  auto options = std::make_shared<TrainBenchOptions>();
  CLI::App* command = bench.add_subcommand(
      "train",
      "Time data-parallel training in ordered and exact mode in the same run (the exact over "
      "ordered step time), and check that exact mode ends on one digest over several layouts");
  TrainOptions& train = options->train;
  train.steps = "40";
  add_shared_train_options(*command, train);
  train.steps_option = command->add_option("--steps", train.steps, "optimizer steps (default 40)");
  train.epochs_option =
      command->add_option("--epochs", train.epochs, "whole epochs instead of --steps");
  train.ranks_option = command->add_option(
      "--ranks", train.ranks,
      "ranks of the ordered run and of the exact run it is compared with (default 2)");
  command->add_option("--layouts", options->layouts,
                      "exact-mode layouts, e.g. 1,2,4,3x2 (ranks x micro-batches); default: "
                      "--ranks");
  command->add_option("--rounds", options->rounds,
                      "ordered and exact runs on --ranks, alternated, for the ratio (default 3)");
  add_flag(*command, "--json", train.json, "print one JSON object");
  command->callback([options] { run_train_bench(*options); });
}

void add_fsdp_bench(CLI::App& bench) {
  auto options = std::make_shared<FsdpBenchOptions>();
  CLI::App* command = bench.add_subcommand(
      "fsdp",
      "Exposed communication of FSDP on a simulated link with and without prefetch, FSDP against "
      "DDP step time and peak memory, and one exact digest over DDP, FSDP and HSDP layouts");
  TrainOptions& train = options->train;
  train.ranks = "8";
  add_timed_train_options(*command, train, "12");
  train.ranks_option = command->add_option("--ranks", train.ranks, "thread ranks (default 8)");
  command->add_option("--link", options->link, "simulated link LATENCY,GBPS (default 20us,10)");
  options->topology.add_to(*command, /*with_link=*/false);
  command->add_option("--exact-steps", options->exact_steps,
                      "steps of each exact layout run (default 3; 0 skips them)");
  command->add_option("--hsdp-replicas", options->hsdp_replicas,
                      "replicas of the hsdp layout the topology runs time (default 2; 0 or 1 "
                      "skips it; it must divide --ranks)");
  add_flag(*command, "--json", train.json, "print one JSON object");
  command->callback([options] { run_fsdp_bench(*options); });
}

void add_tp_bench(CLI::App& bench) {
  auto options = std::make_shared<TpBenchOptions>();
  CLI::App* command = bench.add_subcommand(
      "tp",
      "Tensor parallelism on a simulated link: step time of FSDP x TP (and dp x fsdp x tp with "
      "sequence parallelism) against FSDP alone on 8 thread ranks, the link time each step's "
      "collectives take and how much of it the step exposes, the tensor-parallel collectives "
      "per step, and exact against ordered TP step time");
  TrainOptions& train = options->train;
  train.model = "gpt";
  add_timed_train_options(*command, train, "6");
  command->add_option("--link", options->link, "simulated link LATENCY,GBPS (default 20us,10)");
  options->topology.add_to(*command, /*with_link=*/false);
  command->add_option("--rounds", options->rounds,
                      "ordered and exact tp 2 runs, alternated, for the ratio (default 2)");
  add_flag(*command, "--json", train.json, "print one JSON object");
  command->callback([options] { run_tp_bench(*options); });
}

void add_train_command(CLI::App& app) {
  auto options = std::make_shared<TrainOptions>();
  CLI::App* command = app.add_subcommand(
      "train",
      "Train data-parallel: an MLP on Fashion-MNIST (or any MNIST-format directory), or a GPT on "
      "text (--model gpt; Debian's fortunes or any UTF-8 text)");
  add_shared_train_options(*command, *options);
  options->activation_option =
      command->add_option("--activation", options->activation, "mlp: relu or gelu (default relu)");
  add_flag(*command, "--layernorm", options->layernorm, "mlp: LayerNorm after each hidden Linear");
  options->epochs_option = command->add_option(
      "--epochs", options->epochs, fmt::format("epochs (default 8; gpt: {} steps)", kGptSteps));
  options->steps_option =
      command->add_option("--steps", options->steps, "optimizer steps instead of epochs");
  command->add_option("--micro-batches", options->micro_batches,
                      "pieces each rank's slice is split into, summed before one reduction "
                      "(default 1; with a pp dim: 2 per pp rank)");
  command->add_option("--pipeline-schedule", options->pipeline_schedule,
                      "with a pp mesh dim: gpipe, 1f1b (default) or interleaved-1f1b");
  command->add_option("--virtual-stages", options->virtual_stages,
                      "model chunks per pp rank for interleaved-1f1b (default 2)");
  command->add_option("--activation-checkpointing", options->activation_checkpointing,
                      "none (default), full (every block recomputes its forward in backward) or "
                      "selective (every second block)");
  command->add_option("--weight-decay", options->weight_decay, "weight decay (default 0)");
  command->add_option("--momentum", options->momentum, "SGD momentum (default 0.9)");
  command->add_option("--warmup", options->warmup,
                      fmt::format("steps of linear warmup (default 0; gpt {})", kGptWarmup));
  command->add_option("--eval-every", options->eval_every,
                      fmt::format("also evaluate and report every N steps (default: each epoch "
                                  "end; gpt {})",
                                  kGptEvalEvery));
  command->add_option("--schedule", options->schedule, "cosine or constant (default cosine)");
  options->ranks_option =
      command->add_option("--ranks", options->ranks, "data-parallel ranks (threads; default 2)");
  command->add_option("--backend", options->backend, "threads, or mpi under mpirun");
  command->add_option("--mode", options->mode, "gradient reduction: ordered, exact or native");
  command->add_option("--strategy", options->strategy,
                      "ddp, fsdp or hsdp (default: hsdp with --mesh, ddp otherwise)");
  command->add_option("--mesh", options->mesh,
                      "hsdp mesh RxS: R replicas of S-way sharding (ranks = R*S; default 2xN/2); "
                      "with --names, the sizes of the named dims (e.g. 2x2x2)");
  command->add_option("--names", options->names,
                      "names of the --mesh dims: pp (pipeline stages), dp (replicate), fsdp "
                      "(shard), tp (tensor parallel), e.g. pp,fsdp,tp");
  add_flag(*command, "--sequence-parallel", options->sequence_parallel,
           "with a tp dim: norms and the residual stream on sequence shards");
  command->add_option("--clip-grad-norm", options->clip_grad_norm,
                      "clip gradients to this global L2 norm (default 0: off)");
  add_flag(*command, "--verify-generator", options->verify_generator,
           "gpt: after training, generate on 1 rank and score the tokens with this run's "
           "forward on its layout; print the largest log-probability difference");
  add_flag(*command, "--explain-parallelism", options->explain_parallelism,
           "print the tensor-parallel plan and the collectives of the first step");
  add_flag(*command, "--reshard-after-forward", options->reshard_after_forward,
           "free gathered parameters after forward, gather again for backward (the default)");
  add_flag(*command, "--no-reshard-after-forward", options->no_reshard_after_forward,
           "keep gathered parameters from forward to backward");
  command->add_option("--prefetch", options->prefetch,
                      "parameter groups gathered ahead of use (default 1; 0: none)");
  command->add_option("--param-dtype", options->param_dtype,
                      "dtype parameters are gathered and computed in: f32, bf16, f16");
  command->add_option("--reduce-dtype", options->reduce_dtype,
                      "dtype gradients are reduced in: f32, bf16, f16 (ordered/native modes)");
  command->add_option("--micro-batch-mode", options->micro_batch_mode,
                      "no-sync (sum locally, reduce on the last) or reduce-scatter (reduce-scatter "
                      "each, all-reduce the last)");
  command->add_option("--link", options->link,
                      "simulated network for threads, LATENCY,GBPS (e.g. 20us,10)");
  options->topology.add_to(*command, /*with_link=*/false);
  command->add_option("--trace", options->trace,
                      "write every rank's events to this Chrome trace JSON (Perfetto opens it)");
  command->add_option("--save", options->save,
                      "checkpoint root: save there at the end (and every --save-every steps)");
  command->add_option("--save-every", options->save_every,
                      "save every N steps (default: at the end)");
  command->add_option("--keep-checkpoints", options->keep_checkpoints,
                      "keep only the newest N checkpoints under --save (default: all)");
  command->add_option("--resume", options->resume,
                      "resume from this checkpoint (or root with LATEST), on any layout");
  command->add_option("--stop-after", options->stop_after,
                      "stop after N epochs (N steps with --steps), as a preemption would");
  command->add_option("--log", options->log, "write the per-epoch figures to this CSV file");
  command->add_option("--plot", options->plot, "draw loss and accuracy per epoch to this PNG");
  add_flag(*command, "--json", options->json, "one JSON object per epoch and a final one");
  command->callback([options] { run_train(*options); });
}

}  // namespace meshtensor::cli
