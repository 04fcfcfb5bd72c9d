#include <algorithm>
#include <iostream>
#include <memory>
#include <mutex>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <meshtensor/comm/mpi_backend.hpp>
#include <meshtensor/comm/threads_backend.hpp>
#include <meshtensor/core/error.hpp>
#include <meshtensor/mesh/parse.hpp>

#include "collective_bench.hpp"
#include "commands.hpp"
#include "redistribute_bench.hpp"

namespace meshtensor::cli {

namespace {

struct CollectiveBenchOptions {
  std::string op = "all_reduce";
  std::string dtype = "f32";
  std::int64_t count = 1 << 24;
  std::string mode = "ordered";
  std::string backend = "threads";
  int ranks = 2;
  bool ranks_given = false;
  int iterations = 0;
  bool json = false;
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

void print(const CollectiveBenchOptions& options, const bench::CollectiveBenchConfig& config,
           const bench::CollectiveBenchResult& result, std::optional<double> bound_s) {
  if (options.json) {
    nlohmann::json out = {{"op", options.op},
                          {"dtype", options.dtype},
                          {"count", config.count},
                          {"mode", options.mode},
                          {"backend", options.backend},
                          {"ranks", result.ranks},
                          {"iterations", result.iterations},
                          {"time_s", result.time_s},
                          {"native_time_s", result.native_time_s},
                          {"ratio", result.ratio},
                          {"algbw_gbs", result.algbw_gbs},
                          {"busbw_gbs", result.busbw_gbs}};
    if (bound_s) {
      out["memory_bound_time_s"] = *bound_s;
      out["memory_bound_fraction"] = *bound_s / result.time_s;
    }
    std::cout << out.dump() << '\n';
    return;
  }
  std::cout << fmt::format(
      "{} {} x {} on {} ranks ({}), {} timed calls per mode (median)\n"
      "  {:<8} {:10.3f} ms   busbw {:7.2f} GB/s\n"
      "  {:<8} {:10.3f} ms   busbw {:7.2f} GB/s\n"
      "  ratio    {:10.3f}      ({} / native)\n",
      options.op, options.dtype, config.count, result.ranks, options.backend, result.iterations,
      options.mode, result.time_s * 1e3, result.busbw_gbs, "native", result.native_time_s * 1e3,
      result.native_time_s > 0 ? result.busbw_gbs * result.time_s / result.native_time_s : 0.0,
      result.ratio, options.mode);
  if (bound_s) {
    std::cout << fmt::format(
        "  memory bound {:7.3f} ms (a parallel memcpy of the bytes every rank must read and "
        "write); reached {:.2f} of it\n",
        *bound_s * 1e3, *bound_s / result.time_s);
  }
}

void run_collective_bench(const CollectiveBenchOptions& options) {
  bench::CollectiveBenchConfig config;
  config.op = parse_op(options.op);
  config.dtype = parse_dtype(options.dtype);
  config.count = options.count;
  config.mode = comm::parse_reduction_mode(options.mode);
  config.iterations = options.iterations;
  if (options.count < 1) {
    throw InvalidArgument(fmt::format("--count must be positive, not {}", options.count));
  }
  if (options.iterations < 0) {
    throw InvalidArgument(fmt::format("--iterations must be positive, not {}", options.iterations));
  }
  if (options.ranks_given && options.ranks < 1) {
    throw InvalidArgument(fmt::format("--ranks must be positive, not {}", options.ranks));
  }
  if (options.backend == "threads") {
    const int ranks = options.ranks_given ? options.ranks : 2;
    if (ranks < 1 || ranks > 64) {
      throw InvalidArgument(fmt::format("--ranks must be 1 to 64 for bench, not {}", ranks));
    }
    bench::CollectiveBenchResult result;
    std::mutex result_mutex;
    comm::run_threads(ranks, [&](comm::Communicator& world) {
      const bench::CollectiveBenchResult mine = bench::time_collective(world, config);
      if (world.rank() == 0) {
        const std::lock_guard lock(result_mutex);
        result = mine;
      }
    });
    const double bytes =
        static_cast<double>(config.count) * static_cast<double>(dtype_size(config.dtype));
    const int workers =
        std::max(1, std::min(ranks, static_cast<int>(std::thread::hardware_concurrency())));
    // Below a few MiB a copy's time is mostly thread start-up, not memory: no bound then.
    std::optional<double> bound_s;
    if (bytes >= kMinBoundBytes) {
      bound_s = bench::copy_time_s(
          static_cast<std::int64_t>(memory_traffic_bytes(config.op, ranks, bytes) / 2), workers);
    }
    print(options, config, result, bound_s);
    return;
  }
  if (options.backend == "mpi") {
    comm::MpiWorld world(nullptr, nullptr);
    if (options.ranks_given && options.ranks != world.size()) {
      throw InvalidArgument(fmt::format("--ranks {} does not match the {} processes mpirun started",
                                        options.ranks, world.size()));
    }
    const bench::CollectiveBenchResult result =
        bench::time_collective(*world.communicator(), config);
    if (world.rank() == 0) print(options, config, result, std::nullopt);
    return;
  }
  throw ParseError(fmt::format("unknown --backend '{}': expected threads or mpi", options.backend));
}

struct RedistributeBenchOptions {
  std::string mesh = "4x2x1";
  std::string from = "P,P,R";
  std::string to = "R,R,R";
  std::string shape = "1024x1024";
  std::string dtype = "f32";
  std::string mode = "ordered";
  std::string backend = "threads";
  int iterations = 5;
  bool json = false;
};

bench::RedistributeBenchConfig redistribute_config(const RedistributeBenchOptions& options) {
  bench::RedistributeBenchConfig config;
  config.mesh = parse_mesh(options.mesh);
  config.from = parse_spec(options.from);
  config.to = parse_spec(options.to);
  config.shape = parse_shape(options.shape);
  config.dtype = parse_dtype(options.dtype);
  config.mode = comm::parse_reduction_mode(options.mode);
  config.iterations = options.iterations;
  config.from.validate(config.mesh, config.shape.rank());
  config.to.validate(config.mesh, config.shape.rank());
  if (options.iterations < 1) {
    throw InvalidArgument(fmt::format("--iterations must be positive, not {}", options.iterations));
  }
  return config;
}

void print_redistribute(const RedistributeBenchOptions& options,
                        const bench::RedistributeBenchConfig& config,
                        const bench::RedistributeBenchResult& result,
                        const bench::PlanningTime& planning) {
  if (options.json) {
    const nlohmann::json out = {{"mesh", config.mesh.to_string()},
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
    std::cout << out.dump() << '\n';
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
}

void run_redistribute_bench(const RedistributeBenchOptions& options) {
  const bench::RedistributeBenchConfig config = redistribute_config(options);
  const bench::PlanningTime planning =
      bench::time_planning(config.mesh, config.from, config.to, config.shape, config.dtype, 20);
  if (options.backend == "threads") {
    if (config.mesh.size() > 64) {
      throw InvalidArgument(fmt::format("mesh {} has {} ranks; bench runs at most 64 threads",
                                        config.mesh.to_string(), config.mesh.size()));
    }
    bench::RedistributeBenchResult result;
    std::mutex result_mutex;
    comm::run_threads(static_cast<int>(config.mesh.size()), [&](comm::Communicator& world) {
      const std::shared_ptr<comm::Communicator> shared(&world, [](comm::Communicator*) {});
      const bench::RedistributeBenchResult mine = bench::time_redistribute(shared, config);
      if (world.rank() == 0) {
        const std::lock_guard lock(result_mutex);
        result = mine;
      }
    });
    print_redistribute(options, config, result, planning);
    return;
  }
  if (options.backend == "mpi") {
    comm::MpiWorld world(nullptr, nullptr);
    if (world.size() != config.mesh.size()) {
      throw InvalidArgument(fmt::format("mesh {} has {} ranks, but mpirun started {} processes",
                                        config.mesh.to_string(), config.mesh.size(), world.size()));
    }
    const bench::RedistributeBenchResult result =
        bench::time_redistribute(world.communicator(), config);
    if (world.rank() == 0) print_redistribute(options, config, result, planning);
    return;
  }
  throw ParseError(fmt::format("unknown --backend '{}': expected threads or mpi", options.backend));
}

// Planning cases from 1-D to 4-D meshes, uneven shapes, nested shards and partials.
void run_plan_bench(bool json) {
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
      "Time a collective in one reduction mode against the backend's native collective");
  collective->add_option("--op", options->op,
                         "all_reduce, reduce_scatter, all_gather or all_to_all");
  collective->add_option("--dtype", options->dtype, "element type: f64 f32 bf16 f16 i64 i32 u8");
  collective->add_option("--count", options->count, "elements (default 16777216)");
  collective->add_option("--mode", options->mode, "ordered, exact or native");
  collective->add_option("--backend", options->backend, "threads, or mpi under mpirun");
  CLI::Option* ranks = collective->add_option(
      "--ranks", options->ranks, "threads: ranks to run (default 2); mpi: must match mpirun -np");
  collective->add_option("--iterations", options->iterations,
                         "timed calls per mode (default: about two seconds' worth, at least 3)");
  collective->add_flag("--json", options->json, "print one JSON object");
  collective->callback([options, ranks] {
    options->ranks_given = ranks->count() > 0;
    run_collective_bench(*options);
  });

  auto redistribute_options = std::make_shared<RedistributeBenchOptions>();
  CLI::App* redistribute = bench->add_subcommand(
      "redistribute",
      "Time the merged redistribute plan against the unmerged one (one mesh dim per collective) "
      "in the same run, and the planning time");
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
  redistribute->add_flag("--json", redistribute_options->json, "print one JSON object");
  redistribute->callback([redistribute_options] { run_redistribute_bench(*redistribute_options); });

  auto plan_json = std::make_shared<bool>(false);
  CLI::App* plan = bench->add_subcommand(
      "plan", "Planning time per call, uncached and cached, for meshes from 1-D to 4-D");
  plan->add_flag("--json", *plan_json, "print JSON");
  plan->callback([plan_json] { run_plan_bench(*plan_json); });
}

}  // namespace meshtensor::cli
