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
#include <meshtensor/hf/hf_model.hpp>
#include <meshtensor/train/result_json.hpp>
#include <meshtensor/train/trainer.hpp>

#include "backend.hpp"
#include "commands.hpp"
#include "options.hpp"
#include "output_files.hpp"
#include "plot.hpp"
#include "timing.hpp"
#include "train_options.hpp"

namespace meshtensor::cli {

using bench::steady_median;

namespace {

/// "784 inputs, relu" / "2.4 MB of text, ...": what the first line of a run names.
std::string describe_task(const LoadedTask& loaded) {
  if (loaded.language) {
    const auto& task = dynamic_cast<const train::LanguageModelling&>(*loaded.task);
    const train::TextCorpus& corpus = task.corpus();
    const tokenize::Tokenizer& tokenizer = task.tokenizer();
    return fmt::format(
        "{} parameters; {} training and {} validation bytes from {} file(s), {} records{}",
        nn::decoder_parameter_count(task.model()), corpus.train.size(), corpus.validation.size(),
        corpus.files, corpus.records,
        tokenizer.is_bytes()
            ? ""
            : fmt::format("; tokenizer {} of {} tokens: {} and {} tokens", tokenizer.name(),
                          tokenizer.vocabulary(), task.train_tokens(), task.validation_tokens()));
  }
  const auto& task = dynamic_cast<const train::ImageClassification&>(*loaded.task);
  return fmt::format("{}{}", task.model().activation == nn::Activation::gelu ? "gelu" : "relu",
                     task.model().layernorm ? ", layernorm" : "");
}

/// The model a run trains, as its config text (an --init's decoder).
std::string model_name(const TrainOptions& options, const LoadedTask& loaded) {
  if (!options.settings.given("init")) return options.model;
  return nn::decoder_spec_text(dynamic_cast<const train::LanguageModelling&>(*loaded.task).model());
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
        "step {:>5}  train loss {:.4f}  validation loss {:.4f} ({:.4f} bits per byte)  validation "
        "acc {:.4f}  {:.0f} tokens/s  ({:.1f} s)",
        e.steps, e.train_loss, e.test_loss, train::bits_per_byte(e.test_loss, *loaded.task).value(),
        e.test_accuracy, e.targets_per_second, e.seconds);
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
  const NamedPath roots[] = {{"--save", options.settings.value("save")}};
  const NamedPath inputs[] = {
      {"--data", data},
      {"--resume", options.settings.value("resume")},
      {"--tokenizer", options.tokenizer},
      {"--init",
       hf::folder_of(options.settings.value("init")).value_or(options.settings.value("init"))}};
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

/// What every rank must agree on before training: the data, the task and every setting.
std::string run_fingerprint(const TrainOptions& options, const train::Task& task,
                            const train::TrainConfig& config, const std::string& data) {
  return fmt::format("train data={} task={} trace={} settings={}", data, task.architecture(),
                     options.trace, train::settings_json(config).dump());
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
    const std::optional<double> bits = train::bits_per_byte(result.test_loss, *loaded.task);
    std::cout << fmt::format("{} loss {:.4f}{}, accuracy {:.4f} after {} steps ({:.1f} s)\n", eval,
                             result.test_loss,
                             bits ? fmt::format(" ({:.4f} bits per byte)", *bits) : "",
                             result.test_accuracy, result.steps, result.seconds);
  } else {
    std::cout << fmt::format("no {} set; {} steps ({:.1f} s)\n", eval, result.steps,
                             result.seconds);
  }
  if (loaded.language && config.sample) {
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
  print_pipeline(result, pp::checkpointing_name(config.activation_checkpointing));
  if (!result.healed_steps.empty())
    std::cout << fmt::format("healed from a live group to step {}\n",
                             fmt::join(result.healed_steps, ", "));
  std::cout << fmt::format(
      "weights digest {} ({} parameters in {} tensors; replicas {} "
      "on {} ranks)\n",
      digest_hex(result.digest), result.parameters, result.parameter_tensors,
      result.replicas_identical ? "identical" : "DIFFER", ranks);
  if (result.evaluated) {
    std::cout << fmt::format("logits digest {} (the first evaluation windows)\n",
                             digest_hex(result.logits_digest));
  }
  if (config.verify_generator && result.evaluated) {
    const auto& check = result.generator_check;
    std::cout << fmt::format(
        "generator check: {} tokens generated on 1 rank, scored by the trainer on this "
        "layout: {} with the same log-probability bits, largest difference {:.3g}\n",
        check.tokens, check.identical, check.largest_difference);
  }
  if (options.explain_parallelism) {
    std::cout << "parallel plan:\n";
    for (const auto& [module, style] : result.parallel_plan)
      std::cout << fmt::format("  {:<22} {}\n", module, style);
    std::cout << "tensor-parallel collectives of the first step (rank 0):\n" << result.parallel_log;
  }
  if (traced) std::cout << fmt::format("trace written to {}\n", options.trace);
}

void run_train(const TrainOptions& options) {
  const train::TrainSettings settings = train_settings(options);
  const train::TrainConfig config = ft::replica_group_defaults(
      settings.config(trains_language(options)), options.replica_groups,
      options.settings.given("strategy") || options.settings.given("mesh"));
  const Backend backend = parse_backend(options.backend);
  const std::int64_t ranks = layout_ranks(options, settings);
  if (!options.link.empty() && backend == Backend::mpi)
    throw ParseError("--link simulates a network on the threads backend; mpi has a real one");
  TopologyOptions topology = options.topology;
  topology.link = options.link;
  topology.check_backend(backend == Backend::mpi);
  comm::SimulatedNetwork network = topology.network(ranks);
  options.timeout.apply();
  const LoadedTask loaded = load_task(options);
  const train::Task& task = *loaded.task;
  // Checked once: on threads before the ranks start, on mpi by each process for its world.
  std::optional<train::CheckedConfig> checked;
  if (backend == Backend::threads) checked = train::check_config(config, task, ranks, ranks);
  RunOutputs outputs = open_outputs(options, loaded.data);
  OutputFile* const trace_file = outputs.trace.get();
  OutputFile* const plot = outputs.plot.get();
  std::ofstream* const log = outputs.log ? &outputs.log->stream() : nullptr;
  const std::string command = run_fingerprint(options, task, config, loaded.data);
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
              model_name(options, loaded), describe_task(loaded), world.size(),
              backend == Backend::threads ? "threads" : "mpi", strategy_text(options),
              comm::reduction_mode_name(config.mode), config.batch, config.micro_batches,
              loaded.data);
          std::cout.flush();
        }
        const train::TrainCallbacks callbacks = progress_callbacks(options, loaded, terminal, log);
        std::optional<ft::ReplicaGroups> replicas;
        if (options.replica_groups.groups > 0)
          replicas.emplace(world, options.replica_groups,
                           train::run_fingerprint(config, task, world.size()));
        const train::TrainResult result = train::train(
            world, task, checked ? *checked : train::check_config(config, task, 1, world.size()),
            callbacks, replicas ? &*replicas : nullptr);
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
          draw_plot(
              *plot, result.epochs,
              fmt::format("meshtensor train {} on {} ranks, mode {}", model_name(options, loaded),
                          world.size(), comm::reduction_mode_name(config.mode)),
              eval, loaded.language || config.eval_every > 0);
        }
        if (!result.replicas_identical && config.mode != comm::ReductionMode::native)
          set_exit_status(1);
      },
      std::move(network));
}

/// The options of a fault-tolerant run (docs/fault-tolerance.md).
void add_replica_group_options(CLI::App& c, ft::ReplicaGroupsConfig& g) {
  c.add_option("--replica-groups", g.groups, "fault-tolerant run: its number of replica groups");
  c.add_option("--replica-group", g.group, "this job's replica group, 0 .. N - 1");
  c.add_option("--coordinator", g.coordinator, "the replica groups' coordinator, HOST:PORT");
  c.add_option("--min-replica-groups", g.min_groups, "fewest groups a step runs with (1)");
  c.add_option("--replica-timeout", g.timeout, "seconds to wait for a silent group (10)");
  c.add_option("--replica-host", g.host, "address other groups reach this one at");
}

}  // namespace

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
  options->settings.add_to(*command, train::TrainSettings::table(),
                           {"epochs",
                            "steps",
                            "micro_batches",
                            "pipeline_schedule",
                            "virtual_stages",
                            "activation_checkpointing",
                            "weight_decay",
                            "momentum",
                            "warmup",
                            "eval_every",
                            "schedule",
                            "mode",
                            "strategy",
                            "mesh",
                            "names",
                            "sequence_parallel",
                            "clip_grad_norm",
                            "verify_generator",
                            "reshard_after_forward",
                            "prefetch",
                            "param_dtype",
                            "reduce_dtype",
                            "micro_batch_mode",
                            "save",
                            "save_every",
                            "keep_checkpoints",
                            "resume",
                            "init",
                            "stop_after"});
  options->ranks_option =
      command->add_option("--ranks", options->ranks, "data-parallel ranks (threads; default 2)");
  command->add_option("--backend", options->backend, "threads, or mpi under mpirun");
  add_flag(*command, "--explain-parallelism", options->explain_parallelism,
           "print the tensor-parallel plan and the collectives of the first step");
  add_flag(*command, "--no-reshard-after-forward", options->no_reshard_after_forward,
           "keep gathered parameters from forward to backward");
  add_flag(*command, "--no-sample", options->no_sample,
           "a language model: write no sample of text at the end");
  command->add_option("--link", options->link,
                      "simulated network for threads, LATENCY,GBPS (e.g. 20us,10)");
  options->topology.add_to(*command, /*with_link=*/false);
  command->add_option("--trace", options->trace,
                      "write every rank's events to this Chrome trace JSON (Perfetto opens it)");
  command->add_option("--log", options->log, "write the per-epoch figures to this CSV file");
  command->add_option("--plot", options->plot, "draw loss and accuracy per epoch to this PNG");
  add_flag(*command, "--json", options->json, "one JSON object per epoch and a final one");
  add_replica_group_options(*command, options->replica_groups);
  command->callback([options] { run_train(*options); });
}

}  // namespace meshtensor::cli
