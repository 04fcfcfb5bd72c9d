#include "reports.hpp"

#include <algorithm>
#include <iostream>
#include <optional>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <meshtensor/core/memory.hpp>
#include <meshtensor/kernels/matmul.hpp>
#include <meshtensor/kernels/simd.hpp>
#include <meshtensor/mesh/parse.hpp>

#include "matmul_bench.hpp"
#include "timing.hpp"

namespace meshtensor::bench {

namespace {

constexpr double kMinBoundBytes = 4 << 20;

// Bytes the machine must read plus write at least once, over all ranks of one process, for the
// collective to be done: every rank's input read once, every rank's output written once.
double memory_traffic_bytes(comm::CollectiveKind op, int ranks, double bytes) {
  switch (op) {
    case comm::CollectiveKind::reduce_scatter:
      return ranks * bytes + bytes;  // read every input, write one share per rank
    default:
      return 2.0 * ranks * bytes;  // all_reduce in place, all_gather, all_to_all
  }
}

// One configuration's JSON object.
nlohmann::json result_json(const CollectiveBenchConfig& config, const std::string& backend,
                           const CollectiveBenchResult& result, std::optional<double> bound_s) {
  nlohmann::json out = {{"op", comm::collective_name(config.op)},
                        {"dtype", dtype_name(config.dtype)},
                        {"count", config.count},
                        {"backend", backend},
                        {"ranks", result.ranks},
                        {"iterations", result.iterations},
                        {"native_time_s", result.native_time_s},
                        {"machine", kernels::machine_description()}};
  nlohmann::json modes = nlohmann::json::object();
  for (const ModeTiming& timing : result.modes) {
    modes[std::string(comm::reduction_mode_name(timing.mode))] = {{"time_s", timing.time_s},
                                                                  {"ratio", timing.ratio},
                                                                  {"algbw_gbs", timing.algbw_gbs},
                                                                  {"busbw_gbs", timing.busbw_gbs}};
  }
  out["modes"] = modes;
  // The first mode's figures at the top level as well.
  const ModeTiming& first = result.modes.front();
  out["mode"] = comm::reduction_mode_name(first.mode);
  out["time_s"] = first.time_s;
  out["ratio"] = first.ratio;
  out["algbw_gbs"] = first.algbw_gbs;
  out["busbw_gbs"] = first.busbw_gbs;
  if (bound_s) {
    out["memory_bound_time_s"] = *bound_s;
    out["memory_bound_fraction"] = *bound_s / first.time_s;
  }
  return out;
}

void print_single(const CollectiveBenchConfig& config, const std::string& backend,
                  const CollectiveBenchResult& result, std::optional<double> bound_s) {
  std::cout << fmt::format("{} {} x {} on {} ranks ({}), {} timed calls per mode (median)\n",
                           comm::collective_name(config.op), dtype_name(config.dtype), config.count,
                           result.ranks, backend, result.iterations);
  for (const ModeTiming& timing : result.modes) {
    std::cout << fmt::format("  {:<8} {:10.3f} ms   busbw {:7.2f} GB/s   ratio {:6.3f}\n",
                             comm::reduction_mode_name(timing.mode), timing.time_s * 1e3,
                             timing.busbw_gbs, timing.ratio);
  }
  std::cout << fmt::format("  {:<8} {:10.3f} ms   (the baseline: the backend's own collective)\n",
                           "native", result.native_time_s * 1e3);
  if (bound_s) {
    const double fraction = *bound_s / result.modes.front().time_s;
    std::cout << fmt::format(
        "  memory bound {:7.3f} ms (a parallel memcpy of the bytes every rank must read and "
        "write); reached {:.2f} of it\n",
        *bound_s * 1e3, fraction);
  }
}

// The sweep table: one row per (op, count), one column pair per mode.
void print_table_header(const std::vector<comm::ReductionMode>& modes) {
  std::string header =
      fmt::format("{:>5}  {:<14} {:>10}  {:>12}", "ranks", "op", "count", "native");
  for (comm::ReductionMode mode : modes) {
    header += fmt::format("  {:>12} {:>6}", comm::reduction_mode_name(mode), "ratio");
  }
  std::cout << header << '\n';
}

std::string time_text(double seconds) {
  if (seconds < 1e-3) return fmt::format("{:.2f} us", seconds * 1e6);
  return fmt::format("{:.3f} ms", seconds * 1e3);
}

void print_table_row(const CollectiveBenchConfig& config, const CollectiveBenchResult& result) {
  std::string row =
      fmt::format("{:>5}  {:<14} {:>10}  {:>12}", result.ranks, comm::collective_name(config.op),
                  config.count, time_text(result.native_time_s));
  for (comm::ReductionMode mode : config.modes) {
    const auto found = std::find_if(result.modes.begin(), result.modes.end(),
                                    [&](const ModeTiming& t) { return t.mode == mode; });
    if (found == result.modes.end()) {
      row += fmt::format("  {:>12} {:>6}", "-", "-");  // no reduction: the same movement
    } else {
      row += fmt::format("  {:>12} {:>6.3f}", time_text(found->time_s), found->ratio);
    }
  }
  std::cout << row << '\n' << std::flush;
}

}  // namespace

void report_collectives(comm::Communicator& world,
                        const std::vector<CollectiveBenchConfig>& configs,
                        const CollectiveReport& report) {
  const bool single = configs.size() == 1 && configs.front().modes.size() == 1;
  const bool printer = world.rank() == 0;
  if (printer && !single && !report.json) print_table_header(configs.front().modes);
  for (const CollectiveBenchConfig& config : configs) {
    // Every configuration is refused before it allocates if the ranks on this machine could
    // not hold it (the same verdict on every rank).
    const double per_rank = collective_bench_bytes_per_rank(config, world.size());
    const std::int64_t local = report.threads ? world.size() : 1;
    if (world.rank() == 0 || !report.threads) {
      require_memory(
          per_rank * static_cast<double>(local),
          fmt::format("bench collective {} of {} {} on {} ranks", comm::collective_name(config.op),
                      config.count, dtype_name(config.dtype), world.size()));
    }
    world.barrier();
    const CollectiveBenchResult result = time_collective(world, config);
    if (!printer) continue;
    std::optional<double> bound_s;
    const double bytes =
        static_cast<double>(config.count) * static_cast<double>(dtype_size(config.dtype));
    if (report.threads && single && bytes >= kMinBoundBytes) {
      // Below a few MiB a copy's time is mostly thread start-up, not memory: no bound then.
      const int workers = std::max(
          1, std::min(world.size(), static_cast<int>(std::thread::hardware_concurrency())));
      bound_s = copy_time_s(
          static_cast<std::int64_t>(memory_traffic_bytes(config.op, world.size(), bytes) / 2),
          workers);
    }
    if (report.json) {
      std::cout << result_json(config, report.backend, result, bound_s).dump() << '\n'
                << std::flush;
    } else if (single) {
      print_single(config, report.backend, result, bound_s);
    } else {
      print_table_row(config, result);
    }
  }
}

void print_redistribute(const RedistributeReport& options, const RedistributeBenchConfig& config,
                        const RedistributeBenchResult& result, const PlanningTime& planning) {
  if (options.json) {
    nlohmann::json out = {{"mesh", config.mesh.to_string()},
                          {"from", config.from.to_string()},
                          {"to", config.to.to_string()},
                          {"shape", config.shape.to_string()},
                          {"dtype", dtype_name(config.dtype)},
                          {"mode", options.mode},
                          {"backend", options.backend},
                          {"merged_s", result.merged_s},
                          {"unmerged_s", result.unmerged_s},
                          {"ratio", result.ratio},
                          {"merged_collectives", result.merged_collectives},
                          {"unmerged_collectives", result.unmerged_collectives},
                          {"plan_uncached_s", planning.uncached_s},
                          {"plan_cached_s", planning.cached_s}};
    if (result.topology) {
      out["topology"] = {{"ranks_per_host", options.ranks_per_host},
                         {"aware_s", result.aware_s},
                         {"aware_collectives", result.aware_collectives},
                         {"aware_two_level_steps", result.aware_two_level_steps},
                         {"blind_s", result.merged_s},
                         {"one_dim_s", result.unmerged_s},
                         {"blind_over_aware", result.blind_over_aware},
                         {"one_dim_over_aware", result.one_dim_over_aware},
                         {"measured_collective_s", result.collective_s},
                         {"aware_differs_from_blind", result.aware_differs},
                         {"measured_memory_bandwidth_bytes_s", result.memory_bandwidth_bytes_s}};
    }
    std::cout << out.dump() << '\n' << std::flush;
    return;
  }
  if (result.topology) {
    std::cout << fmt::format(
        "redistribute {} -> {} of {} {} on mesh {} ({}, {} mode, ranks per host {})\n"
        "  topology-aware {:>10.3f} ms  ({} collectives, {} in two levels{})\n"
        "  topology-blind {:>10.3f} ms  ({} collectives)\n"
        "  one dim (DTensor) {:>7.3f} ms  ({} collectives)\n"
        "  speed-up aware over blind {:.2f}x, over one dim {:.2f}x\n"
        "  cost model as measured here: {:.0f} us a collective, {:.2f} GB/s copies per rank\n",
        config.from.to_string(), config.to.to_string(), config.shape.to_string(),
        dtype_name(config.dtype), config.mesh.to_string(), options.backend, options.mode,
        options.ranks_per_host, result.aware_s * 1e3, result.aware_collectives,
        result.aware_two_level_steps, result.aware_differs ? "" : "; the blind plan itself",
        result.merged_s * 1e3, result.merged_collectives, result.unmerged_s * 1e3,
        result.unmerged_collectives, result.blind_over_aware, result.one_dim_over_aware,
        result.collective_s * 1e6, result.memory_bandwidth_bytes_s / 1e9);
    std::cout.flush();
    return;
  }
  std::cout << fmt::format(
      "redistribute {} -> {} of {} {} on mesh {} ({}, {} mode)\n"
      "  merged   {:>10.3f} ms  ({} collectives)\n"
      "  no-merge {:>10.3f} ms  ({} collectives)\n"
      "  ratio merged/no-merge {:.3f}\n"
      "  planning {:.1f} us uncached, {:.3f} us cached\n",
      config.from.to_string(), config.to.to_string(), config.shape.to_string(),
      dtype_name(config.dtype), config.mesh.to_string(), options.backend, options.mode,
      result.merged_s * 1e3, result.merged_collectives, result.unmerged_s * 1e3,
      result.unmerged_collectives, result.ratio, planning.uncached_s * 1e6,
      planning.cached_s * 1e6);
  std::cout.flush();
}

// Planning cases from 1-D to 4-D meshes, uneven shapes, nested shards and partials.
void report_matmul(bool json, int iterations) {
  print_machine_line(json);
  const auto rows = run_matmul_bench(default_matmul_shapes(), iterations);
  const auto exact = run_exact_gradient_bench(0.5, iterations);
  const auto bf16 = run_bf16_matmul_bench(gpt_matmul_shapes(), iterations);
  if (json) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& r : rows) {
      out.push_back({{"form", r.shape.form},
                     {"m", r.shape.m},
                     {"n", r.shape.n},
                     {"k", r.shape.k},
                     {"gflops", r.gflops},
                     {"openblas_gflops", r.openblas_gflops},
                     {"ratio", r.ratio}});
    }
    for (const auto& r : exact) {
      out.push_back({{"form", "exact xᵀ·dy"},
                     {"m", r.shape.m},
                     {"n", r.shape.n},
                     {"k", r.shape.k},
                     {"exact_s", r.exact_seconds},
                     {"ordered_s", r.ordered_seconds},
                     {"time_ratio", r.ratio}});
    }
    for (const auto& r : bf16) {
      out.push_back({{"form", "bf16 " + r.shape.form},
                     {"m", r.shape.m},
                     {"n", r.shape.n},
                     {"k", r.shape.k},
                     {"gflops", r.gflops},
                     {"f32_gflops", r.f32_gflops},
                     {"ratio", r.ratio},
                     {"bf16_dot_products_used", kernels::bf16_dot_products_used()}});
    }
    std::cout << out.dump(2) << '\n';
    return;
  }
  std::cout << "matmul f32, one thread: meshtensor (batch-invariant) against OpenBLAS sgemm, same "
               "run\n";
  std::cout << fmt::format("{:<8} {:>6} {:>6} {:>6} {:>12} {:>12} {:>7}\n", "form", "m", "n", "k",
                           "GFLOP/s", "OpenBLAS", "ratio");
  for (const auto& r : rows) {
    std::cout << fmt::format("{:<8} {:>6} {:>6} {:>6} {:>12.1f} {:>12.1f} {:>7.2f}\n", r.shape.form,
                             r.shape.m, r.shape.n, r.shape.k, r.gflops, r.openblas_gflops, r.ratio);
  }
  std::cout
      << "\nexact-mode weight gradient (binned xᵀ·dy, half of x zero) against the ordered one\n";
  std::cout << fmt::format("{:>6} {:>6} {:>6} {:>12} {:>12} {:>7}\n", "m", "n", "rows", "exact ms",
                           "ordered ms", "x");
  for (const auto& r : exact) {
    std::cout << fmt::format("{:>6} {:>6} {:>6} {:>12.3f} {:>12.3f} {:>7.1f}\n", r.shape.m,
                             r.shape.n, r.shape.k, r.exact_seconds * 1e3, r.ordered_seconds * 1e3,
                             r.ratio);
  }
  std::cout << fmt::format("\nbf16 products (the bf16 chain, {}) against f32 products, same run\n",
                           kernels::bf16_dot_products_used() ? "on the bf16 dot-product instruction"
                                                             : "emulated on the f32 FMAs");
  std::cout << fmt::format("{:<8} {:>6} {:>6} {:>6} {:>12} {:>12} {:>7}\n", "form", "m", "n", "k",
                           "GFLOP/s", "f32", "ratio");
  for (const auto& r : bf16) {
    std::cout << fmt::format("{:<8} {:>6} {:>6} {:>6} {:>12.1f} {:>12.1f} {:>7.2f}\n", r.shape.form,
                             r.shape.m, r.shape.n, r.shape.k, r.gflops, r.f32_gflops, r.ratio);
  }
}

void report_planning(bool json) {
  print_machine_line(json);
  struct Case {
    const char* mesh;
    const char* from;
    const char* to;
    const char* shape;
  };
  const Case cases[] = {
      {"8", "P", "S0", "1000x1000"},
      {"4x2", "P,P", "S0,S1", "1001x999"},
      {"2x2x2", "P,R,P", "R,R,R", "64x64x64"},
      {"8x5x1", "P,P,R", "R,R,R", "4096x4096"},
      {"2x3x2", "S0,S1,S0", "S1@1,S0@0,S1@0", "97x89"},
      {"2x2x2x2", "P,S0,P,S1", "S1,R,S0,R", "1024x1024"},
      {"2x2x2x2", "S0,S1,S0,S1", "S1,S0,S1,S0", "1024x1024"},
      {"4x2x2x4", "P(avg),P,S0,S1", "S0,S1,R,P", "512x512x8"},
  };
  nlohmann::json rows = nlohmann::json::array();
  for (const Case& c : cases) {
    const DeviceMesh mesh = parse_mesh(c.mesh);
    const PlacementSpec from = parse_spec(c.from);
    const PlacementSpec to = parse_spec(c.to);
    const PlanningTime time = time_planning(mesh, from, to, parse_shape(c.shape), DType::f32, 20);
    if (json) {
      rows.push_back({{"mesh", c.mesh},
                      {"from", c.from},
                      {"to", c.to},
                      {"shape", c.shape},
                      {"collectives", time.collectives},
                      {"uncached_s", time.uncached_s},
                      {"cached_s", time.cached_s},
                      {"cache_speedup", time.uncached_s / time.cached_s}});
    } else {
      std::cout << fmt::format(
          "{:<8} {:<16} -> {:<16} {:>2} collectives  {:>9.1f} us uncached  "
          "{:>7.3f} us cached\n",
          c.mesh, c.from, c.to, time.collectives, time.uncached_s * 1e6, time.cached_s * 1e6);
    }
  }
  if (json) std::cout << rows.dump() << '\n';
}

}  // namespace meshtensor::bench
