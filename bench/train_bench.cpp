#include "train_bench.hpp"

#include <atomic>
#include <iostream>
#include <map>
#include <tuple>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <meshtensor/comm/threads_backend.hpp>
#include <meshtensor/core/digest.hpp>
#include <meshtensor/core/memory.hpp>
#include <meshtensor/core/profile.hpp>
#include <meshtensor/kernels/matmul.hpp>
#include <meshtensor/train/result_json.hpp>
#include <meshtensor/train/task.hpp>

#include "timing.hpp"

namespace meshtensor::bench {

namespace {

struct TrainBenchRun {
  std::string mode;
  DType param_dtype = DType::f32;
  TrainLayout layout;
  double samples_per_second = 0.0;
  /// Mean of the steps after the first two whose times lie in their middle half (steady_steps).
  double step_seconds = 0.0;
  double test_accuracy = 0.0;
  double test_loss = 0.0;
  std::uint64_t digest = 0;
  bool replicas_identical = false;
  ProfileSeconds profile{};  ///< rank 0's seconds a step of each row, over the same steps
};

/// A run's step time and profile from the same steps: those after the first two (which allocate
/// and warm the caches) whose times lie in their middle half, so that a slow step moves neither
/// and the profile's rows add up to the step time.
void take_steady_steps(const train::TrainResult& result, TrainBenchRun& run) {
  constexpr std::size_t kWarmup = 2;
  if (result.step_seconds.size() <= kWarmup ||
      result.step_profiles.size() + kWarmup != result.step_seconds.size()) {
    run.step_seconds = steady_step_seconds(result.step_seconds);
    return;
  }
  const std::vector<double> steady(result.step_seconds.begin() + kWarmup,
                                   result.step_seconds.end());
  const std::vector<std::size_t> kept = middle_half(steady);
  for (const std::size_t i : kept) {
    run.step_seconds += steady[i];
    for (std::size_t r = 0; r < kProfileRows; ++r)
      run.profile[r] += result.step_profiles[i][r];
  }
  const auto count = static_cast<double>(kept.size());
  run.step_seconds /= count;
  for (double& seconds : run.profile)
    seconds /= count;
}

TrainBenchRun time_training(const train::Task& task, train::TrainConfig config,
                            TrainLayout layout) {
  config.micro_batches = layout.micro_batches;
  TrainBenchRun run;
  run.mode = std::string(comm::reduction_mode_name(config.mode));
  run.param_dtype = config.param_dtype;
  run.layout = layout;
  comm::run_threads(static_cast<int>(layout.ranks), [&](comm::Communicator& world) {
    const train::TrainResult result = train::train(world, task, config, {});
    if (world.rank() != 0) return;
    double seconds = 0.0;
    std::int64_t samples = 0;
    for (const train::EpochReport& e : result.epochs) {
      seconds += e.seconds;
      samples += e.samples;
    }
    run.samples_per_second = seconds > 0 ? static_cast<double>(samples) / seconds : 0.0;
    take_steady_steps(result, run);
    run.test_accuracy = result.test_accuracy;
    run.test_loss = result.test_loss;
    run.digest = result.digest;
    run.replicas_identical = result.replicas_identical;
  });
  return run;
}

/// One row for repeated runs of one mode and layout: the run whose step time is the median (the
/// lower of the middle two of an even count), its profile with it, and the median throughput of
/// all; `agree` turns false when a rerun ended on other bits.
TrainBenchRun combine_rounds(const std::vector<TrainBenchRun>& rounds, bool& agree) {
  std::vector<double> steps;
  for (const TrainBenchRun& run : rounds)
    steps.push_back(run.step_seconds);
  TrainBenchRun combined = rounds[order_by_size(steps)[(steps.size() - 1) / 2]];
  std::vector<double> throughputs;
  for (const TrainBenchRun& run : rounds) {
    throughputs.push_back(run.samples_per_second);
    agree = agree && run.digest == combined.digest;
    combined.replicas_identical = combined.replicas_identical && run.replicas_identical;
  }
  combined.samples_per_second = median(throughputs);
  return combined;
}

/// A run's model FLOP/s and MFU, against the peak of the dtype it computed in.
train::Utilisation run_utilisation(const train::Task& task, train::TrainConfig config,
                                   const TrainBenchRun& r) {
  config.param_dtype = r.param_dtype;
  return train::utilisation(task, config, r.layout.ranks, r.step_seconds);
}

/// The timed runs of `bench train` as JSON rows.
nlohmann::json train_bench_rows(const std::vector<TrainBenchRun>& runs, const train::Task& task,
                                const train::TrainConfig& config) {
  const bool language = dynamic_cast<const train::LanguageModelling*>(&task) != nullptr;
  nlohmann::json rows = nlohmann::json::array();
  const std::string eval = task.eval_name();
  for (const TrainBenchRun& r : runs) {
    nlohmann::json row = {{"mode", r.mode},
                          {"param_dtype", dtype_name(r.param_dtype)},
                          {"ranks", r.layout.ranks},
                          {"micro_batches", r.layout.micro_batches},
                          {"samples_per_second", r.samples_per_second},
                          {"step_seconds", r.step_seconds},
                          {eval + "_loss", r.test_loss},
                          {eval + "_accuracy", r.test_accuracy},
                          {"digest", digest_hex(r.digest)},
                          {"replicas_identical", r.replicas_identical}};
    const train::Utilisation u = run_utilisation(task, config, r);
    row["model_flops_per_second"] = u.model_flops_per_second;
    row["peak_flops_per_second"] = u.peak_flops_per_second;
    row["mfu"] = u.mfu;
    for (std::size_t p = 0; p < kProfileRows; ++p)
      row["profile"][std::string(profile_row_name(static_cast<ProfileRow>(p)))] = r.profile[p];
    if (language) {
      row["tokens_per_second"] =
          r.samples_per_second * static_cast<double>(task.targets_per_sample());
    }
    rows.push_back(row);
  }
  return rows;
}

/// The timed runs of `bench train` as a table.
void print_train_bench_rows(const std::vector<TrainBenchRun>& runs, const train::Task& task,
                            const train::TrainConfig& config) {
  const auto per_sample = static_cast<double>(task.targets_per_sample());
  std::cout << fmt::format("{:<12} {:>5} {:>6} {:>10} {:>9} {:>7} {:>6} {:>9} {:>9}  {}\n", "mode",
                           "ranks", "micro", fmt::format("{}s/s", task.target_name()), "step ms",
                           "GFLOP/s", "MFU", task.eval_name().substr(0, 4) + " loss", "acc",
                           "digest");
  for (const TrainBenchRun& r : runs) {
    const train::Utilisation u = run_utilisation(task, config, r);
    std::cout << fmt::format(
        "{:<12} {:>5} {:>6} {:>10.0f} {:>9.1f} {:>7.1f} {:>5.1f}% {:>9.4f} "
        "{:>9.4f}  {}{}\n",
        r.param_dtype == DType::f32 ? r.mode
                                    : r.mode + " " + std::string(dtype_name(r.param_dtype)),
        r.layout.ranks, r.layout.micro_batches, r.samples_per_second * per_sample,
        r.step_seconds * 1e3, u.model_flops_per_second / 1e9, 100 * u.mfu, r.test_loss,
        r.test_accuracy, digest_hex(r.digest), r.replicas_identical ? "" : "  (replicas DIFFER)");
    std::string profile;
    for (std::size_t p = 0; p < kProfileRows; ++p) {
      profile += fmt::format("{}{} {:.1f}", p == 0 ? "" : ", ",
                             profile_row_name(static_cast<ProfileRow>(p)), r.profile[p] * 1e3);
    }
    std::cout << fmt::format("  profile of rank 0, ms a step: {}\n", profile);
  }
}

}  // namespace

int run_train_bench(const TrainBenchConfig& bench) {
  print_machine_line(bench.input.json);
  train::TrainConfig config = bench.input.config;
  const std::int64_t ranks = bench.ranks;
  const std::vector<TrainLayout> layouts =
      bench.layouts.empty() ? std::vector<TrainLayout>{TrainLayout{ranks, 1}} : bench.layouts;
  const std::int64_t rounds = bench.rounds;
  config.sample = false;
  const train::Task& task = *bench.input.task;
  train::TrainConfig largest = config;
  largest.mode = comm::ReductionMode::exact;
  for (const TrainLayout& layout : layouts) {
    largest.micro_batches = layout.micro_batches;
    train::validate_config(largest, task);  // every layout refused before any run is timed
    train::require_training_memory(largest, task, layout.ranks, layout.ranks);
  }
  train::require_training_memory(largest, task, ranks, ranks);

  // Ordered and exact runs on --ranks alternate, so that the host's load lands on both modes:
  // the ratio is the median of the rounds' ratios.
  const TrainLayout compared{ranks, 1};
  std::vector<TrainBenchRun> ordered_rounds;
  std::vector<TrainBenchRun> exact_rounds;
  std::vector<double> ratios;
  // bf16 compute: f32 ordered runs in the same rounds, for bf16's speed-up.
  const bool bf16 = config.param_dtype == DType::bf16;
  std::vector<TrainBenchRun> f32_rounds;
  std::vector<double> bf16_speedups;
  for (std::int64_t round = 0; round < rounds; ++round) {
    config.mode = comm::ReductionMode::ordered;
    ordered_rounds.push_back(time_training(task, config, compared));
    if (bf16) {
      train::TrainConfig f32 = config;
      f32.param_dtype = DType::f32;
      f32_rounds.push_back(time_training(task, f32, compared));
      bf16_speedups.push_back(f32_rounds.back().step_seconds / ordered_rounds.back().step_seconds);
    }
    config.mode = comm::ReductionMode::exact;
    exact_rounds.push_back(time_training(task, config, compared));
    ratios.push_back(exact_rounds.back().step_seconds / ordered_rounds.back().step_seconds);
  }
  const double ratio = median(ratios);
  bool reruns_agree = true;
  std::vector<TrainBenchRun> runs{combine_rounds(ordered_rounds, reruns_agree)};
  for (const TrainLayout& layout : layouts) {
    if (layout.ranks == compared.ranks && layout.micro_batches == compared.micro_batches) {
      runs.push_back(combine_rounds(exact_rounds, reruns_agree));
    } else {
      runs.push_back(time_training(task, config, layout));
    }
  }
  if (bf16) runs.push_back(combine_rounds(f32_rounds, reruns_agree));
  bool digests_agree = true;
  bool replicas_agree = true;
  for (const TrainBenchRun& r : runs) {
    replicas_agree = replicas_agree && r.replicas_identical;
    if (r.mode == "exact" && r.param_dtype == config.param_dtype)
      digests_agree = digests_agree && r.digest == runs[1].digest;
  }
  if (bench.input.json) {
    nlohmann::json out = {{"model", bench.input.model},
                          {"batch", config.batch},
                          {"runs", train_bench_rows(runs, task, config)},
                          {"exact_digests_identical", digests_agree},
                          {"reruns_identical", reruns_agree},
                          {"exact_over_ordered_step_time", ratio},
                          {"exact_over_ordered_rounds", ratios}};
    if (bf16) {
      out["bf16_over_f32_tokens_per_second"] = median(bf16_speedups);
      out["bf16_over_f32_rounds"] = bf16_speedups;
      out["bf16_dot_products_used"] = kernels::bf16_dot_products_used();
    }
    std::cout << out.dump(2) << '\n';
  } else {
    std::cout << fmt::format("training {} (global batch {}, {}) on threads\n", bench.input.model,
                             config.batch,
                             config.steps > 0 ? fmt::format("{} steps", config.steps)
                                              : fmt::format("{} epochs", config.epochs));
    print_train_bench_rows(runs, task, config);
    std::cout << fmt::format(
        "exact / ordered step time on {} ranks: {:.2f}x, median of {} alternated rounds ({:.2f}) "
        "(goal: at most 2x)\n",
        ranks, ratio, rounds, fmt::join(ratios, ", "));
    if (bf16) {
      std::cout << fmt::format(
          "bf16 / f32 ordered throughput on {} ranks: {:.2f}x, median of {} alternated rounds "
          "({:.2f}) (goal: at least 1.6x where bf16 dot products run; here they {})\n",
          ranks, median(bf16_speedups), rounds, fmt::join(bf16_speedups, ", "),
          kernels::bf16_dot_products_used() ? "do" : "do not");
    }
    std::cout << fmt::format("reruns of each mode: {}\n", reruns_agree ? "identical" : "DIFFER");
    std::cout << fmt::format("exact digests over {} layout(s): {}\n", layouts.size(),
                             digests_agree ? "identical" : "DIFFER");
  }
  return digests_agree && replicas_agree && reruns_agree ? 0 : 1;
}

namespace {

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
  comm::run_threads(
      static_cast<int>(world_size),
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

void print_fsdp_json(const FsdpBenchFigures& f, const FsdpBenchConfig& options,
                     const Topology& hosts) {
  nlohmann::json out = {
      {"ranks", f.ranks},
      {"link", options.link_text},
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

void print_fsdp_text(const FsdpBenchFigures& f, const FsdpBenchConfig& options,
                     const Topology& hosts) {
  std::cout << fmt::format(
      "fsdp bench: {} thread ranks, model {}, global batch {}, {} steps, simulated link {}\n",
      f.ranks, options.input.model, f.batch, f.steps, options.link_text);
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

}  // namespace

int run_fsdp_bench(const FsdpBenchConfig& options) {
  print_machine_line(options.input.json);
  train::TrainConfig base = options.input.config;
  base.sample = false;
  FsdpBenchFigures f;
  f.ranks = options.ranks;
  const std::int64_t exact_steps = options.exact_steps;
  const std::int64_t hsdp_replicas = options.hsdp_replicas;
  const comm::LinkDelay& link = options.link;
  const train::Task& task = *options.input.task;
  train::TrainConfig largest = base;
  largest.mode = comm::ReductionMode::exact;
  largest.strategy = train::Strategy::ddp;  // the most memory of the layouts it runs
  train::validate_config(largest, task);
  train::require_training_memory(largest, task, f.ranks, f.ranks);
  const Topology& hosts = options.hosts;

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
  if (options.placed) {
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
  if (options.input.json) {
    print_fsdp_json(f, options, hosts);
  } else {
    print_fsdp_text(f, options, hosts);
  }
  return f.digests_agree && f.replicas_agree ? 0 : 1;
}

namespace {

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

void print_tp_bench(const TpBenchConfig& options, const std::vector<LinkedPair>& layouts,
                    double exact_ms, double ordered_ms, const std::vector<TopologyPair>& on_hosts,
                    const Topology& hosts) {
  const double tp_over_fsdp = layouts[1].linked.step_seconds / layouts[0].linked.step_seconds;
  const double exact_ratio = exact_ms / ordered_ms;
  if (options.input.json) {
    nlohmann::json out = {{"link", options.link_text},
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

}  // namespace

int run_tp_bench(const TpBenchConfig& options) {
  print_machine_line(options.input.json);
  train::TrainConfig base = options.input.config;
  base.sample = false;
  base.eval_every = 0;
  if (base.steps == 0) base.steps = 6;
  const std::int64_t rounds = options.rounds;
  const comm::LinkDelay& link = options.link;
  const train::Task& task = *options.input.task;
  const auto layout = [&](const std::string& mesh, const std::string& names,
                          bool sequence_parallel) {
    train::TrainConfig config = base;
    config.mesh = train::parse_named_mesh(mesh, names);
    config.sequence_parallel = sequence_parallel;
    train::validate_config(config, task);
    task.check_tensor_parallel(train::mesh_dim(config, "tp"));
    train::require_training_memory(config, task, config.mesh->size(), config.mesh->size());
    return config;
  };
  const Topology& hosts = options.hosts;
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
  if (options.placed) {
    on_hosts.push_back(
        measure_on_hosts(task, "fsdp x tp 4x2", layout("4x2", "fsdp,tp", false), 8, hosts));
    on_hosts.push_back(measure_on_hosts(task, "dp x fsdp x tp 2x2x2 + SP",
                                        layout("2x2x2", "dp,fsdp,tp", true), 8, hosts));
  }
  print_tp_bench(options, layouts, median(exact_ms), median(ordered_ms), on_hosts, hosts);
  int status = 0;
  for (const LinkedPair& pair : layouts)
    if (!pair.linked.replicas_identical) status = 1;
  for (const TopologyPair& pair : on_hosts)
    if (!pair.aware.replicas_identical) status = 1;
  return status;
}

}  // namespace meshtensor::bench
