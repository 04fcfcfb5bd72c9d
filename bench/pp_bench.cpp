// `meshtensor bench pp`: the pipeline schedules' measured bubble against their theory on the
// simulated link, real pipelined training steps, and activation checkpointing's memory and time.
#include "pp_bench.hpp"

#include <algorithm>
#include <chrono>
#include <iostream>
#include <memory>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <meshtensor/comm/threads_backend.hpp>
#include <meshtensor/core/error.hpp>
#include <meshtensor/core/memory.hpp>
#include <meshtensor/nn/gradients.hpp>
#include <meshtensor/nn/models.hpp>
#include <meshtensor/pp/pipeline.hpp>
#include <meshtensor/pp/stage.hpp>

#include "timing.hpp"

namespace meshtensor::bench {

namespace {

using Clock = std::chrono::steady_clock;

/// What the bench measured.
struct ReplayFigures {
  double forward_seconds = 0;  ///< one micro-batch through one stage, measured on one rank
  double backward_seconds = 0;
  double step_seconds = 0;  ///< median replayed step
  double bubble = 0;        ///< measured idle fraction, mean over ranks
  double theory = 0;
};

struct TrainingFigures {
  std::string name;
  double step_seconds = 0;
  double bubble = 0;  ///< pipelined runs: rank 0's median
  std::vector<std::int64_t> activation_peaks;
  std::uint64_t digest = 0;
};

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

/// Forward and backward seconds of one micro-batch (`rows` windows) through the blocks one of
/// `stages` stages holds (a middle stage: its blocks only), measured here on one rank.
std::pair<double, double> stage_seconds(const train::Task& task, std::int64_t stages,
                                        std::int64_t rows) {
  std::unique_ptr<nn::Module> built = task.make_model(0);
  auto& whole = dynamic_cast<nn::Decoder&>(*built);
  const auto children = whole.children();
  const auto split = pp::split_blocks(whole.layers(), stages);
  std::vector<std::pair<std::string, nn::Module*>> units;
  for (std::int64_t b = split.back().first; b < split.back().second; ++b)
    units.push_back(children[static_cast<std::size_t>(b) + 1]);
  pp::StageModule stage(units, true);
  nn::DenseGradients sink(stage.parameters());
  const Tensor input = Tensor::random_normal({rows, whole.context(), whole.dim()}, DType::f32, 1);
  std::vector<double> forward;
  std::vector<double> backward;
  for (int i = 0; i < 5; ++i) {
    auto start = Clock::now();
    const Tensor output = stage.forward(input);
    forward.push_back(seconds_since(start));
    start = Clock::now();
    stage.backward(Tensor::full(output.shape(), DType::f32, 0.01), sink, true);
    backward.push_back(seconds_since(start));
  }
  return {median(forward), median(backward)};
}

/// Stages whose every forward and backward takes the measured time (slept, so p ranks do not
/// compete for this machine's cores) and pass tensors of the real activation's size.
class ReplayedStages : public pp::StageWork {
 public:
  ReplayedStages(Shape boundary, double forward_seconds, double backward_seconds)
      : boundary_(std::move(boundary)),
        forward_(std::chrono::duration<double>(forward_seconds)),
        backward_(std::chrono::duration<double>(backward_seconds)) {}
  Tensor first_input(std::int64_t) override { return Tensor::zeros(boundary_, DType::f32); }
  Shape boundary_shape(std::int64_t) override { return boundary_; }
  Tensor forward(std::int64_t, std::int64_t, const Tensor&) override {
    std::this_thread::sleep_for(forward_);
    return Tensor::zeros(boundary_, DType::f32);
  }
  Tensor loss_gradient(std::int64_t, const Tensor&) override {
    return Tensor::zeros(boundary_, DType::f32);
  }
  Tensor backward(std::int64_t, std::int64_t, const Tensor&) override {
    std::this_thread::sleep_for(backward_);
    return Tensor::zeros(boundary_, DType::f32);
  }

 private:
  Shape boundary_;
  std::chrono::duration<double> forward_;
  std::chrono::duration<double> backward_;
};

ReplayFigures replay_on_link(const train::Task& task, const nn::DecoderSpec& model,
                             const pp::ScheduleConfig& schedule, std::int64_t rows,
                             const std::string& link, std::int64_t rounds) {
  ReplayFigures figures;
  const auto [forward, backward] = stage_seconds(task, schedule.stages(), rows);
  figures.forward_seconds = forward;
  figures.backward_seconds = backward;
  figures.theory = pp::theoretical_bubble(schedule);
  std::vector<std::vector<double>> bubbles(static_cast<std::size_t>(schedule.ranks));
  std::vector<double> steps;
  comm::run_threads(
      static_cast<int>(schedule.ranks),
      [&](comm::Communicator& world) {
        pp::Pipeline pipeline(world, schedule);
        ReplayedStages work(Shape{rows, model.context, model.dim}, forward, backward);
        for (std::int64_t r = 0; r <= rounds; ++r) {
          const pp::PipelineStepStats stats = pipeline.run_step(work);
          if (r == 0) continue;  // the links' first messages start their threads
          bubbles[static_cast<std::size_t>(world.rank())].push_back(stats.bubble());
          if (world.rank() == 0) steps.push_back(stats.seconds);
        }
      },
      comm::SimulatedNetwork(comm::parse_link(link)));
  for (const auto& rank : bubbles)
    figures.bubble += median(rank) / static_cast<double>(bubbles.size());
  figures.step_seconds = median(steps);
  return figures;
}

TrainingFigures measure_run(const train::Task& task, const std::string& name,
                            const train::TrainConfig& config, std::int64_t ranks,
                            const std::string& link) {
  TrainingFigures figures;
  figures.name = name;
  train::validate_config(config, task);
  train::require_training_memory(config, task, ranks, ranks);
  comm::run_threads(
      static_cast<int>(ranks),
      [&](comm::Communicator& world) {
        const train::TrainResult result = train::train(world, task, config);
        if (world.rank() != 0) return;
        figures.step_seconds = steady_step_seconds(result.step_seconds);
        figures.bubble = steady_median(result.pipeline.step_bubbles, 1);
        figures.activation_peaks = result.activation_peaks;
        figures.digest = result.digest;
      },
      comm::SimulatedNetwork(comm::parse_link(link)));
  return figures;
}

/// Activation checkpointing none, full and selective on one rank, alternated for `rounds`
/// rounds: each one's median step time (the machine's drift falls on all three alike).
std::vector<TrainingFigures> measure_checkpointing(const train::Task& task,
                                                   const train::TrainConfig& one,
                                                   const std::string& link, std::int64_t rounds) {
  const pp::Checkpointing kinds[] = {pp::Checkpointing::none, pp::Checkpointing::full,
                                     pp::Checkpointing::selective};
  std::vector<TrainingFigures> figures(std::size(kinds));
  std::vector<std::vector<double>> steps(std::size(kinds));
  for (std::int64_t r = 0; r < rounds; ++r) {
    for (std::size_t k = 0; k < std::size(kinds); ++k) {
      train::TrainConfig config = one;
      config.activation_checkpointing = kinds[k];
      figures[k] =
          measure_run(task, "checkpointing " + pp::checkpointing_name(kinds[k]), config, 1, link);
      steps[k].push_back(figures[k].step_seconds);
    }
  }
  for (std::size_t k = 0; k < std::size(kinds); ++k)
    figures[k].step_seconds = median(steps[k]);
  return figures;
}

std::string peaks_text(const std::vector<std::int64_t>& peaks) {
  std::vector<std::string> texts;
  for (const std::int64_t p : peaks)
    texts.push_back(format_bytes(static_cast<double>(p)));
  return fmt::format("{}", fmt::join(texts, ", "));
}

nlohmann::json run_json(const TrainingFigures& f) {
  return {{"name", f.name},
          {"step_seconds", f.step_seconds},
          {"bubble", f.bubble},
          {"activation_peak_bytes", f.activation_peaks},
          {"digest", fmt::format("{:016x}", f.digest)}};
}

/// Everything `bench pp` measured.
struct PpBenchFigures {
  const nn::DecoderSpec& model;
  comm::ReductionMode mode;
  pp::ScheduleConfig schedule;
  std::int64_t rows;  // windows per micro-batch
  const std::string& link;
  const ReplayFigures& replay;
  const TrainingFigures& whole;
  const TrainingFigures& pipelined;
  const std::vector<TrainingFigures>& checkpointing;  // none first
  double memory_ratio(const TrainingFigures& f) const {
    return static_cast<double>(checkpointing[0].activation_peaks.at(0)) /
           static_cast<double>(f.activation_peaks.at(0));
  }
  double time_ratio(const TrainingFigures& f) const {
    return f.step_seconds / checkpointing[0].step_seconds;
  }
};

void print_pp_json(const PpBenchFigures& f) {
  const ReplayFigures& replay = f.replay;
  nlohmann::json out = {{"model", nn::decoder_spec_text(f.model)},
                        {"mode", comm::reduction_mode_name(f.mode)},
                        {"stages", f.schedule.ranks},
                        {"schedule", pp::schedule_name(f.schedule.kind)},
                        {"virtual_stages", f.schedule.virtual_stages},
                        {"micro_batches", f.schedule.micro_batches},
                        {"link", f.link},
                        {"replay",
                         {{"forward_seconds", replay.forward_seconds},
                          {"backward_seconds", replay.backward_seconds},
                          {"step_seconds", replay.step_seconds},
                          {"bubble", replay.bubble},
                          {"theoretical_bubble", replay.theory},
                          {"bubble_over_theory", replay.bubble / replay.theory}}},
                        {"one_rank", run_json(f.whole)},
                        {"pipelined", run_json(f.pipelined)},
                        {"checkpointing", nlohmann::json::array()}};
  for (const TrainingFigures& run : f.checkpointing) {
    nlohmann::json row = run_json(run);
    row["memory_reduction"] = f.memory_ratio(run);
    row["step_time_ratio"] = f.time_ratio(run);
    out["checkpointing"].push_back(row);
  }
  std::cout << out.dump() << '\n';
}

void print_pp_text(const PpBenchFigures& f) {
  const ReplayFigures& replay = f.replay;
  std::cout << fmt::format(
      "model {}, mode {}, {} stages, {} schedule ({} virtual stage(s) a rank), {} "
      "micro-batches of {} window(s), link {}\n",
      nn::decoder_spec_text(f.model), comm::reduction_mode_name(f.mode), f.schedule.ranks,
      pp::schedule_name(f.schedule.kind), f.schedule.virtual_stages, f.schedule.micro_batches,
      f.rows, f.link);
  std::cout << fmt::format(
      "schedule on the runtime, compute replayed (forward {:.2f} ms, backward {:.2f} ms a "
      "stage, measured on 1 rank): step {:.1f} ms, bubble {:.3f} against theory {:.3f}: "
      "{:.2f}x\n",
      replay.forward_seconds * 1e3, replay.backward_seconds * 1e3, replay.step_seconds * 1e3,
      replay.bubble, replay.theory, replay.bubble / replay.theory);
  std::cout << fmt::format(
      "real steps ({} ranks share this machine's {} cores): 1 rank {:.1f} ms; {} {:.1f} ms, "
      "bubble of rank 0 {:.3f}, digests {}\n",
      f.schedule.ranks, std::thread::hardware_concurrency(), f.whole.step_seconds * 1e3,
      f.pipelined.name, f.pipelined.step_seconds * 1e3, f.pipelined.bubble,
      f.whole.digest == f.pipelined.digest ? "equal" : "DIFFER");
  std::cout << fmt::format("activation peak per stage: {}\n",
                           peaks_text(f.pipelined.activation_peaks));
  for (const TrainingFigures& run : f.checkpointing) {
    std::cout << fmt::format(
        "{:<24} step {:>7.1f} ms ({:.2f}x)  activations {:>10} ({:.2f}x less)  digest "
        "{:016x}\n",
        run.name, run.step_seconds * 1e3, f.time_ratio(run), peaks_text(run.activation_peaks),
        f.memory_ratio(run), run.digest);
  }
}

}  // namespace

int run_pp_bench(const PipelineBenchConfig& options) {
  print_machine_line(options.input.json);
  train::TrainConfig base = options.input.config;
  base.sample = false;
  base.eval_every = 0;
  if (base.steps == 0) base.steps = 6;
  const std::int64_t stages = options.stages;
  const std::int64_t rounds = options.rounds;
  const std::int64_t checkpointing_rounds = options.checkpointing_rounds;
  const train::Task& task = *options.input.task;
  const auto* language = dynamic_cast<const train::LanguageModelling*>(&task);
  if (language == nullptr)
    throw ParseError("bench pp splits a decoder: give --model gpt[:...] or llama[:...]");
  const nn::DecoderSpec& model = language->model();
  train::TrainConfig piped = base;
  piped.mesh = train::parse_named_mesh(std::to_string(stages), "pp");
  if (!options.micro_batches_given) piped.micro_batches = 2 * stages;
  train::validate_config(piped, task);
  const pp::ScheduleConfig schedule{piped.pipeline_schedule, stages, train::virtual_stages(piped),
                                    piped.micro_batches};
  const std::int64_t rows = std::max<std::int64_t>(1, base.batch / piped.micro_batches);
  const ReplayFigures replay = replay_on_link(task, model, schedule, rows, options.link, rounds);
  // Real steps: the pipeline against one rank, then activation checkpointing on one rank.
  train::TrainConfig one = base;
  one.micro_batches = 1;
  // One rank runs no schedule: the pipeline's settings stay with the pipelined run.
  one.pipeline_schedule = pp::ScheduleKind::one_f_one_b;
  one.virtual_stages = 0;
  const TrainingFigures whole = measure_run(task, "1 rank", one, 1, options.link);
  const TrainingFigures pipelined =
      measure_run(task, fmt::format("pp {} {}", stages, pp::schedule_name(schedule.kind)), piped,
                  stages, options.link);
  const std::vector<TrainingFigures> checkpointing =
      measure_checkpointing(task, one, options.link, checkpointing_rounds);
  const PpBenchFigures figures{model,  base.mode, schedule,  rows,         options.link,
                               replay, whole,     pipelined, checkpointing};
  if (options.input.json) {
    print_pp_json(figures);
  } else {
    print_pp_text(figures);
  }
  bool same = whole.digest == pipelined.digest;
  for (const TrainingFigures& f : checkpointing)
    same = same && f.digest == checkpointing[0].digest;
  return !same && base.mode == comm::ReductionMode::exact ? 1 : 0;
}

}  // namespace meshtensor::bench
