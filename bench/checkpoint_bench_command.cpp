#include <algorithm>
#include <iostream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "bench_commands.hpp"
#include "checkpoint_bench.hpp"
#include "options.hpp"
#include "timing.hpp"

namespace meshtensor::cli {

namespace {

struct CheckpointBenchOptions {
  std::string ranks = "8";
  std::string megabytes = "1024";
  std::string repeats = "3";
  std::string directory;
  bool json = false;
};

nlohmann::json timing_json(const bench::CheckpointTiming& t) {
  nlohmann::json out = {{"name", t.name},
                        {"seconds", t.seconds},
                        {"bytes", t.bytes},
                        {"gigabytes_per_second", t.gigabytes_per_second()}};
  if (!t.bytes_read_per_rank.empty()) {
    out["bytes_read_per_rank"] = t.bytes_read_per_rank;
    out["target_bytes_per_rank"] = t.target_bytes_per_rank;
  }
  return out;
}

void run(const CheckpointBenchOptions& options) {
  bench::print_machine_line(options.json);
  bench::CheckpointBenchConfig config;
  config.ranks = static_cast<int>(integer_setting("--ranks", options.ranks, 2, 64));
  config.megabytes = integer_setting("--mib", options.megabytes, 1, 1 << 20);
  config.repeats = static_cast<int>(integer_setting("--repeats", options.repeats, 1, 100));
  config.directory = options.directory;
  const bench::CheckpointBenchResult r = bench::run_checkpoint_bench(config);
  const double save_ratio = r.baseline_write.seconds / r.save.seconds;
  const double load_ratio = r.baseline_read.seconds / r.load_same.seconds;
  const double load_vs_dd = r.baseline_discard.seconds / r.load_same.seconds;
  const double load_vs_fresh = r.baseline_fresh.seconds / r.load_same.seconds;
  const double reshard_ratio = r.load_nested.seconds / r.load_same.seconds;
  const double other_dim_ratio = r.load_other_dim.seconds / r.load_same.seconds;
  bool reads_exact = true;
  for (const auto* t : {&r.load_same, &r.load_nested, &r.load_other_dim, &r.load_hsdp})
    reads_exact = reads_exact && t->bytes_read_per_rank == t->target_bytes_per_rank;
  if (options.json) {
    nlohmann::json out = {{"ranks", config.ranks},
                          {"bytes", r.save.bytes},
                          {"tensors", r.tensors},
                          {"repeats", config.repeats},
                          {"timings", nlohmann::json::array()},
                          {"save_vs_sequential_write", save_ratio},
                          {"load_vs_sequential_read", load_ratio},
                          {"load_vs_dd_read", load_vs_dd},
                          {"load_vs_sequential_read_into_new_memory", load_vs_fresh},
                          {"reshard_load_vs_same_layout_load", reshard_ratio},
                          {"other_dim_load_vs_same_layout_load", other_dim_ratio},
                          {"bytes_read_equal_target_blocks", reads_exact}};
    for (const auto* t :
         {&r.baseline_write, &r.baseline_read, &r.baseline_fresh, &r.baseline_discard, &r.save,
          &r.load_same, &r.load_nested, &r.load_other_dim, &r.load_hsdp})
      out["timings"].push_back(timing_json(*t));
    std::cout << out.dump(1) << '\n';
    return;
  }
  std::cout << fmt::format(
      "checkpoint of {:.0f} MiB ({} f32 tensors of 4093 x 4096) on {} thread ranks, median of "
      "{} run(s); the sequential baselines use the same disk in the same run\n",
      static_cast<double>(r.save.bytes) / (1 << 20), r.tensors, config.ranks, config.repeats);
  std::cout << fmt::format("{:<40} {:>9} {:>9}\n", "", "seconds", "GB/s");
  for (const auto* t : {&r.baseline_write, &r.baseline_read, &r.baseline_fresh, &r.baseline_discard,
                        &r.save, &r.load_same, &r.load_nested, &r.load_other_dim, &r.load_hsdp}) {
    std::cout << fmt::format("{:<40} {:>9.3f} {:>9.2f}\n", t->name, t->seconds,
                             t->gigabytes_per_second());
  }
  std::cout << fmt::format("save / sequential write throughput:        {:.2f}  (goal >= 0.7)\n",
                           save_ratio);
  std::cout << fmt::format(
      "load / sequential read throughput:         {:.2f} into touched memory (goal >= 0.7), "
      "{:.2f} into new memory, {:.2f} of dd's one reused buffer\n",
      load_ratio, load_vs_fresh, load_vs_dd);
  std::cout << fmt::format("reshard load (2 x n, uneven) / same layout: {:.2f}  (goal <= 1.2)\n",
                           reshard_ratio);
  std::cout << fmt::format(
      "load onto Shard(1) / same layout:           {:.2f}  (one read per "
      "strided run)\n",
      other_dim_ratio);
  for (const auto* t : {&r.load_same, &r.load_nested, &r.load_other_dim, &r.load_hsdp}) {
    std::cout << fmt::format(
        "bytes read per rank, {}: {} (target blocks: {})\n", t->name,
        fmt::join(t->bytes_read_per_rank, " "),
        t->bytes_read_per_rank == t->target_bytes_per_rank ? "equal" : "DIFFERENT");
  }
}

}  // namespace

void add_checkpoint_bench(CLI::App& bench) {
  auto options = std::make_shared<CheckpointBenchOptions>();
  CLI::App* command = bench.add_subcommand(
      "checkpoint",
      "Save and load of a sharded model state against sequential write and read of the same "
      "bytes, loads onto other layouts, bytes read per rank");
  command->add_option("--ranks", options->ranks, "thread ranks (default 8, even)");
  command->add_option("--mib", options->megabytes, "model state in MiB (default 1024)");
  command->add_option("--repeats", options->repeats, "runs per figure, median (default 3)");
  command->add_option("--dir", options->directory,
                      "directory to write in (default: the system's temporary directory)");
  add_flag(*command, "--json", options->json, "print one JSON object");
  command->callback([options] { run(*options); });
}

}  // namespace meshtensor::cli
