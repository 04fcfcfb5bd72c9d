#include <algorithm>
#include <iostream>
#include <memory>
#include <mutex>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <meshtensor/comm/threads_backend.hpp>
#include <meshtensor/core/error.hpp>
#include <meshtensor/core/memory.hpp>
#include <meshtensor/kernels/simd.hpp>
#include <meshtensor/mesh/parse.hpp>

#include "backend.hpp"
#include "collective_bench.hpp"
#include "commands.hpp"
#include "matmul_bench.hpp"
#include "options.hpp"
#include "redistribute_bench.hpp"

namespace meshtensor::cli {

namespace {

// Most threads a benchmark runs: timing many more ranks than cores measures the scheduler.
constexpr int kMaxBenchThreads = 64;

struct CollectiveBenchOptions {
  std::string op = "all_reduce";
  std::string dtype = "f32";
  std::string count = "16777216";
  std::string mode = "ordered";
  std::string backend = "threads";
  std::string ranks = "2";
  CLI::Option* ranks_option = nullptr;
  std::string iterations = "0";
  bool json = false;
  TimeoutOption timeout;
};

comm::CollectiveKind parse_op(const std::string& text) {
  for (comm::CollectiveKind kind :
       {comm::CollectiveKind::all_reduce, comm::CollectiveKind::reduce_scatter,
        comm::CollectiveKind::all_gather, comm::CollectiveKind::all_to_all}) {
    if (comm::collective_name(kind) == text) return kind;
  }
  throw ParseError(fmt::format(
      "unknown --op '{}': expected all_reduce, reduce_scatter, all_gather or all_to_all", text));
}

constexpr double kMinBoundBytes = 4 << 20;
// Most elements one configuration may ask for (what an MPI count can address per rank and call
// is checked by the backend; this only keeps byte counts far from overflow).
constexpr std::int64_t kMaxBenchCount = std::int64_t{1} << 40;

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
nlohmann::json result_json(const bench::CollectiveBenchConfig& config, const std::string& backend,
                           const bench::CollectiveBenchResult& result,
                           std::optional<double> bound_s) {
  nlohmann::json out = {{"op", comm::collective_name(config.op)},
                        {"dtype", dtype_name(config.dtype)},
                        {"count", config.count},
                        {"backend", backend},
                        {"ranks", result.ranks},
                        {"iterations", result.iterations},
                        {"native_time_s", result.native_time_s},
                        {"machine", kernels::machine_description()}};
  nlohmann::json modes = nlohmann::json::object();
  for (const bench::ModeTiming& timing : result.modes) {
    modes[std::string(comm::reduction_mode_name(timing.mode))] = {{"time_s", timing.time_s},
                                                                  {"ratio", timing.ratio},
                                                                  {"algbw_gbs", timing.algbw_gbs},
                                                                  {"busbw_gbs", timing.busbw_gbs}};
  }
  out["modes"] = modes;
  // The first mode's figures at the top level as well.
  const bench::ModeTiming& first = result.modes.front();
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

void print_single(const bench::CollectiveBenchConfig& config, const std::string& backend,
                  const bench::CollectiveBenchResult& result, std::optional<double> bound_s) {
  std::cout << fmt::format("{} {} x {} on {} ranks ({}), {} timed calls per mode (median)\n",
                           comm::collective_name(config.op), dtype_name(config.dtype), config.count,
                           result.ranks, backend, result.iterations);
  for (const bench::ModeTiming& timing : result.modes) {
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

void print_table_row(const bench::CollectiveBenchConfig& config,
                     const bench::CollectiveBenchResult& result) {
  std::string row =
      fmt::format("{:>5}  {:<14} {:>10}  {:>12}", result.ranks, comm::collective_name(config.op),
                  config.count, time_text(result.native_time_s));
  for (comm::ReductionMode mode : config.modes) {
    const auto found = std::find_if(result.modes.begin(), result.modes.end(),
                                    [&](const bench::ModeTiming& t) { return t.mode == mode; });
    if (found == result.modes.end()) {
      row += fmt::format("  {:>12} {:>6}", "-", "-");  // no reduction: the same movement
    } else {
      row += fmt::format("  {:>12} {:>6.3f}", time_text(found->time_s), found->ratio);
    }
  }
  std::cout << row << '\n' << std::flush;
}

void run_collective_bench(const CollectiveBenchOptions& options) {
  print_machine_line(options.json);
  std::vector<comm::CollectiveKind> ops;
  for (const std::string& op : list_option("--op", options.op))
    ops.push_back(parse_op(op));
  std::vector<std::int64_t> counts;
  for (const std::string& count : list_option("--count", options.count))
    counts.push_back(integer_option("--count", count, 1, kMaxBenchCount));
  std::vector<comm::ReductionMode> modes;
  for (const std::string& mode : list_option("--mode", options.mode))
    modes.push_back(comm::parse_reduction_mode(mode));
  const DType dtype = parse_dtype(options.dtype);
  const int iterations =
      static_cast<int>(integer_option("--iterations", options.iterations, 0, 1'000'000));
  const Backend backend = parse_backend(options.backend);
  const bool ranks_given = options.ranks_option->count() > 0;
  const auto ranks =
      static_cast<int>(integer_option("--ranks", options.ranks, 1, comm::kMaxThreadsRanks));
  if (backend == Backend::threads && ranks > kMaxBenchThreads) {
    throw InvalidArgument(fmt::format("--ranks must be 1 to {} for bench on threads, not {}",
                                      kMaxBenchThreads, ranks));
  }
  options.timeout.apply();
  const bool single = ops.size() == 1 && counts.size() == 1 && modes.size() == 1;
  std::vector<bench::CollectiveBenchConfig> configs;
  for (comm::CollectiveKind op : ops) {
    for (std::int64_t count : counts) {
      bench::CollectiveBenchConfig config;
      config.op = op;
      config.dtype = dtype;
      config.count = count;
      config.modes = modes;
      config.iterations = iterations;
      configs.push_back(config);
    }
  }
  const std::string command =
      fmt::format("bench collective op={} dtype={} count={} mode={} iterations={} json={}",
                  options.op, options.dtype, options.count, options.mode, iterations, options.json);
  run_ranks(
      backend, backend == Backend::threads ? ranks : 1, command, [&](comm::Communicator& world) {
        if (backend == Backend::mpi && ranks_given && ranks != world.size()) {
          throw InvalidArgument(fmt::format(
              "--ranks {} does not match the {} processes mpirun started", ranks, world.size()));
        }
        const bool printer = world.rank() == 0;
        if (printer && !single && !options.json) print_table_header(modes);
        for (const bench::CollectiveBenchConfig& config : configs) {
          // Every configuration is refused before it allocates if the ranks on this machine could
          // not hold it (the same verdict on every rank).
          const double per_rank = bench::collective_bench_bytes_per_rank(config, world.size());
          const std::int64_t local = backend == Backend::threads ? world.size() : 1;
          if (world.rank() == 0 || backend == Backend::mpi) {
            require_memory(per_rank * static_cast<double>(local),
                           fmt::format("bench collective {} of {} {} on {} ranks",
                                       comm::collective_name(config.op), config.count,
                                       dtype_name(config.dtype), world.size()));
          }
          world.barrier();
          const bench::CollectiveBenchResult result = bench::time_collective(world, config);
          if (!printer) continue;
          std::optional<double> bound_s;
          const double bytes =
              static_cast<double>(config.count) * static_cast<double>(dtype_size(config.dtype));
          if (backend == Backend::threads && single && bytes >= kMinBoundBytes) {
            // Below a few MiB a copy's time is mostly thread start-up, not memory: no bound then.
            const int workers = std::max(
                1, std::min(world.size(), static_cast<int>(std::thread::hardware_concurrency())));
            bound_s = bench::copy_time_s(
                static_cast<std::int64_t>(memory_traffic_bytes(config.op, world.size(), bytes) / 2),
                workers);
          }
          if (options.json) {
            std::cout << result_json(config, options.backend, result, bound_s).dump() << '\n'
                      << std::flush;
          } else if (single) {
            print_single(config, options.backend, result, bound_s);
          } else {
            print_table_row(config, result);
          }
        }
      });
}

struct RedistributeBenchOptions {
  std::string mesh = "4x2x1";
  std::string from = "P,P,R";
  std::string to = "R,R,R";
  std::string shape = "1024x1024";
  std::string dtype = "f32";
  std::string mode = "ordered";
  std::string backend = "threads";
  std::string iterations = "5";
  bool json = false;
  TimeoutOption timeout;
  TopologyOptions topology;
};

bench::RedistributeBenchConfig redistribute_config(const RedistributeBenchOptions& options) {
  bench::RedistributeBenchConfig config;
  config.mesh = parse_mesh(options.mesh);
  config.from = parse_spec(options.from);
  config.to = parse_spec(options.to);
  config.shape = parse_shape(options.shape);
  config.dtype = parse_dtype(options.dtype);
  config.mode = comm::parse_reduction_mode(options.mode);
  config.iterations =
      static_cast<int>(integer_option("--iterations", options.iterations, 1, 1'000'000));
  config.from.validate(config.mesh, config.shape.rank());
  config.to.validate(config.mesh, config.shape.rank());
  return config;
}

void print_redistribute(const RedistributeBenchOptions& options,
                        const bench::RedistributeBenchConfig& config,
                        const bench::RedistributeBenchResult& result,
                        const bench::PlanningTime& planning) {
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
      out["topology"] = {{"ranks_per_host", options.topology.ranks_per_host},
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
        options.topology.ranks_per_host, result.aware_s * 1e3, result.aware_collectives,
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

void run_redistribute_bench(const RedistributeBenchOptions& options) {
  print_machine_line(options.json);
  const bench::RedistributeBenchConfig config = redistribute_config(options);
  const Backend backend = parse_backend(options.backend);
  // The rank limit before anything is planned: planning a huge mesh to then refuse it wastes
  // minutes.
  if (backend == Backend::threads && config.mesh.size() > kMaxBenchThreads) {
    throw InvalidArgument(fmt::format("mesh {} has {} ranks; bench runs at most {} threads",
                                      config.mesh.to_string(), config.mesh.size(),
                                      kMaxBenchThreads));
  }
  options.topology.check_backend(backend == Backend::mpi);
  const comm::SimulatedNetwork network = options.topology.network(config.mesh.size());
  options.timeout.apply();
  const bench::PlanningTime planning =
      bench::time_planning(config.mesh, config.from, config.to, config.shape, config.dtype, 20);
  const double per_rank = bench::redistribute_bench_bytes_per_rank(config);
  const std::string command = fmt::format(
      "bench redistribute mesh={} from={} to={} shape={} dtype={} mode={} iterations={} json={}",
      config.mesh.to_string(), config.from.to_string(), config.to.to_string(),
      config.shape.to_string(), dtype_name(config.dtype), options.mode, config.iterations,
      options.json);
  require_memory(
      per_rank * static_cast<double>(backend == Backend::threads ? config.mesh.size() : 1),
      fmt::format("bench redistribute of {} {} on mesh {}", config.shape.to_string(),
                  dtype_name(config.dtype), config.mesh.to_string()));
  run_ranks(
      backend, config.mesh.size(), command,
      [&](comm::Communicator& world) {
        const std::shared_ptr<comm::Communicator> shared(&world, [](comm::Communicator*) {});
        if (world.size() != config.mesh.size()) {
          throw InvalidArgument(fmt::format("mesh {} has {} ranks, but mpirun started {} processes",
                                            config.mesh.to_string(), config.mesh.size(),
                                            world.size()));
        }
        const bench::RedistributeBenchResult result = bench::time_redistribute(shared, config);
        if (world.rank() == 0) print_redistribute(options, config, result, planning);
      },
      network);
}

// Planning cases from 1-D to 4-D meshes, uneven shapes, nested shards and partials.
void run_matmul_bench_command(bool json, const std::string& iterations_text) {
  print_machine_line(json);
  const int iterations =
      static_cast<int>(integer_option("--iterations", iterations_text, 0, 100000));
  const auto rows = bench::run_matmul_bench(bench::default_matmul_shapes(), iterations);
  const auto exact = bench::run_exact_gradient_bench(0.5, iterations);
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
}

void run_plan_bench(bool json) {
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
    const bench::PlanningTime time =
        bench::time_planning(mesh, from, to, parse_shape(c.shape), DType::f32, 20);
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

}  // namespace

void add_bench_command(CLI::App& app) {
  CLI::App* bench = app.add_subcommand("bench", "Benchmarks that report ratios to a baseline");
  bench->require_subcommand(1);
  auto options = std::make_shared<CollectiveBenchOptions>();
  CLI::App* collective = bench->add_subcommand(
      "collective",
      "Time a collective in each reduction mode against the backend's native collective; lists "
      "of ops, counts and modes print one table");
  collective->add_option("--op", options->op,
                         "all_reduce, reduce_scatter, all_gather or all_to_all (a list: one row "
                         "each)");
  collective->add_option("--dtype", options->dtype, "element type: f64 f32 bf16 f16 i64 i32 u8");
  collective->add_option("--count", options->count,
                         "elements (default 16777216; a list: one row each)");
  collective->add_option("--mode", options->mode,
                         "ordered, exact or native (a list: one column each)");
  collective->add_option("--backend", options->backend, "threads, or mpi under mpirun");
  options->ranks_option = collective->add_option(
      "--ranks", options->ranks, "threads: ranks to run (default 2); mpi: must match mpirun -np");
  collective->add_option("--iterations", options->iterations,
                         "timed calls per mode (default: about two seconds' worth, at least 5)");
  add_flag(*collective, "--json", options->json, "print one JSON object per configuration");
  options->timeout.add_to(*collective);
  collective->callback([options] { run_collective_bench(*options); });

  auto redistribute_options = std::make_shared<RedistributeBenchOptions>();
  CLI::App* redistribute = bench->add_subcommand(
      "redistribute",
      "Time the merged redistribute plan against the unmerged one (one mesh dim per collective) "
      "in the same run, and the planning time; with --ranks-per-host, the topology-aware plan "
      "against the topology-blind one and the one-dim-at-a-time plan on the simulated links");
  redistribute->add_option("--mesh", redistribute_options->mesh, "mesh sizes (default 4x2x1)");
  redistribute->add_option("--from", redistribute_options->from, "source spec (default P,P,R)");
  redistribute->add_option("--to", redistribute_options->to, "target spec (default R,R,R)");
  redistribute->add_option("--shape", redistribute_options->shape,
                           "global shape (default 1024x1024)");
  redistribute->add_option("--dtype", redistribute_options->dtype, "element type");
  redistribute->add_option("--mode", redistribute_options->mode, "ordered, exact or native");
  redistribute->add_option("--backend", redistribute_options->backend,
                           "threads, or mpi under mpirun");
  redistribute->add_option("--iterations", redistribute_options->iterations,
                           "timed runs of each plan (default 5)");
  add_flag(*redistribute, "--json", redistribute_options->json, "print one JSON object");
  redistribute_options->timeout.add_to(*redistribute);
  redistribute_options->topology.add_to(*redistribute);
  redistribute->callback([redistribute_options] { run_redistribute_bench(*redistribute_options); });

  auto plan_json = std::make_shared<bool>(false);
  auto matmul_json = std::make_shared<bool>(false);
  auto matmul_iterations = std::make_shared<std::string>("0");
  CLI::App* matmul = bench->add_subcommand(
      "matmul",
      "Time the batch-invariant matmul (three forms, the default model's shapes and 512^3) "
      "against OpenBLAS sgemm on one thread, and the exact weight gradient against the ordered "
      "one");
  add_flag(*matmul, "--json", *matmul_json, "print JSON");
  matmul->add_option("--iterations", *matmul_iterations, "timed calls per row (0: about 0.3 s)");
  matmul->callback([matmul_json, matmul_iterations] {
    run_matmul_bench_command(*matmul_json, *matmul_iterations);
  });
  CLI::App* plan = bench->add_subcommand(
      "plan", "Planning time per call, uncached and cached, for meshes from 1-D to 4-D");
  add_flag(*plan, "--json", *plan_json, "print JSON");
  plan->callback([plan_json] { run_plan_bench(*plan_json); });
  add_train_bench(*bench);
  add_fsdp_bench(*bench);
  add_tp_bench(*bench);
  add_pp_bench(*bench);
  add_generate_bench(*bench);
  add_checkpoint_bench(*bench);
  add_rl_bench(*bench);
  add_serve_bench(*bench);
}

}  // namespace meshtensor::cli
