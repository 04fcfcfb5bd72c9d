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
}

}  // namespace meshtensor::cli
