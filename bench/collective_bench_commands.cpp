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
#include "bench_commands.hpp"
#include "collective_bench.hpp"
#include "matmul_bench.hpp"
#include "options.hpp"
#include "redistribute_bench.hpp"
#include "reports.hpp"
#include "timing.hpp"

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

// Most elements one configuration may ask for (what an MPI count can address per rank and call
// is checked by the backend; this only keeps byte counts far from overflow).
constexpr std::int64_t kMaxBenchCount = std::int64_t{1} << 40;

void run_collective_bench(const CollectiveBenchOptions& options) {
  bench::print_machine_line(options.json);
  std::vector<comm::CollectiveKind> ops;
  for (const std::string& op : list_setting("--op", options.op))
    ops.push_back(parse_op(op));
  std::vector<std::int64_t> counts;
  for (const std::string& count : list_setting("--count", options.count))
    counts.push_back(integer_setting("--count", count, 1, kMaxBenchCount));
  std::vector<comm::ReductionMode> modes;
  for (const std::string& mode : list_setting("--mode", options.mode))
    modes.push_back(comm::parse_reduction_mode(mode));
  const DType dtype = parse_dtype(options.dtype);
  const int iterations =
      static_cast<int>(integer_setting("--iterations", options.iterations, 0, 1'000'000));
  const Backend backend = parse_backend(options.backend);
  const bool ranks_given = options.ranks_option->count() > 0;
  const auto ranks =
      static_cast<int>(integer_setting("--ranks", options.ranks, 1, comm::kMaxThreadsRanks));
  if (backend == Backend::threads && ranks > kMaxBenchThreads) {
    throw InvalidArgument(fmt::format("--ranks must be 1 to {} for bench on threads, not {}",
                                      kMaxBenchThreads, ranks));
  }
  options.timeout.apply();
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
  const bench::CollectiveReport report{options.json, options.backend, backend == Backend::threads};
  run_ranks(
      backend, backend == Backend::threads ? ranks : 1, command, [&](comm::Communicator& world) {
        if (backend == Backend::mpi && ranks_given && ranks != world.size()) {
          throw InvalidArgument(fmt::format(
              "--ranks {} does not match the {} processes mpirun started", ranks, world.size()));
        }
        bench::report_collectives(world, configs, report);
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
      static_cast<int>(integer_setting("--iterations", options.iterations, 1, 1'000'000));
  config.from.validate(config.mesh, config.shape.rank());
  config.to.validate(config.mesh, config.shape.rank());
  return config;
}

void run_redistribute_bench(const RedistributeBenchOptions& options) {
  bench::print_machine_line(options.json);
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
        if (world.rank() == 0) {
          bench::print_redistribute(
              {options.json, options.mode, options.backend, options.topology.ranks_per_host},
              config, result, planning);
        }
      },
      network);
}

}  // namespace

void add_collective_bench(CLI::App& bench) {
  auto options = std::make_shared<CollectiveBenchOptions>();
  CLI::App* collective = bench.add_subcommand(
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
}

void add_redistribute_bench(CLI::App& bench) {
  auto redistribute_options = std::make_shared<RedistributeBenchOptions>();
  CLI::App* redistribute = bench.add_subcommand(
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
}

void add_matmul_bench(CLI::App& bench) {
  auto matmul_json = std::make_shared<bool>(false);
  auto matmul_iterations = std::make_shared<std::string>("0");
  CLI::App* matmul = bench.add_subcommand(
      "matmul",
      "Time the batch-invariant matmul (three forms, the default MLP's and GPT's shapes and 512^3) "
      "against OpenBLAS sgemm on one thread, and the exact weight gradient against the ordered "
      "one");
  add_flag(*matmul, "--json", *matmul_json, "print JSON");
  matmul->add_option("--iterations", *matmul_iterations, "timed calls per row (0: about 0.3 s)");
  matmul->callback([matmul_json, matmul_iterations] {
    bench::report_matmul(*matmul_json, static_cast<int>(integer_setting(
                                           "--iterations", *matmul_iterations, 0, 100000)));
  });
}

void add_plan_bench(CLI::App& bench) {
  auto plan_json = std::make_shared<bool>(false);
  CLI::App* plan = bench.add_subcommand(
      "plan", "Planning time per call, uncached and cached, for meshes from 1-D to 4-D");
  add_flag(*plan, "--json", *plan_json, "print JSON");
  plan->callback([plan_json] { bench::report_planning(*plan_json); });
}

}  // namespace meshtensor::cli
