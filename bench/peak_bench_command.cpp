// `meshtensor bench peak`: the machine's f32 FMA peak per core and on all cores at each SIMD
// level, and its bf16 dot-product peak where bf16 matmuls use it, against the theoretical peak
// of the CPU at the clock measured in the same run, and its memory bandwidth (a STREAM triad).
#include <iostream>
#include <memory>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <meshtensor/core/error.hpp>
#include <meshtensor/core/setting_text.hpp>
#include <meshtensor/kernels/matmul.hpp>
#include <meshtensor/kernels/peak.hpp>
#include <meshtensor/kernels/simd.hpp>

#include "bench_commands.hpp"
#include "options.hpp"
#include "timing.hpp"

namespace meshtensor::cli {

namespace {

struct PeakBenchOptions {
  std::string seconds = "0.2";
  std::string triad_mib = "256";
  bool json = false;
};

struct LevelFigures {
  kernels::SimdLevel level;
  kernels::FmaUnits units;
  double per_core = 0;
  double all_cores = 0;
  double clock_hz = 0;  ///< under the level's own FMAs
  double theoretical_per_core = 0;
};

/// The bf16 dot-product instruction's peak, where bf16 matmuls run on it.
struct Bf16Figures {
  bool used = false;
  int flops_per_cycle = 0;  ///< the f32 FMA's at avx512; the instruction does twice that
  double per_core = 0;
  double theoretical_per_core = 0;
};

Bf16Figures measure_bf16(const std::vector<LevelFigures>& levels, double seconds) {
  Bf16Figures f;
  f.used = kernels::bf16_dot_products_used();
  if (!f.used) return f;
  for (const LevelFigures& level : levels) {
    if (level.level != kernels::SimdLevel::avx512) continue;
    f.flops_per_cycle = level.units.flops_per_cycle();
    f.theoretical_per_core = 2.0 * level.units.flops_per_cycle() * level.clock_hz;
  }
  f.per_core = kernels::bf16_dot_flops_per_second(seconds);
  return f;
}

void run_peak_bench(const PeakBenchOptions& options) {
  const double seconds = real_setting("--seconds", options.seconds, 0.01, 60);
  const std::int64_t triad_bytes = integer_setting("--triad-mib", options.triad_mib, 1, 65536)
                                   << 20;
  bench::print_machine_line(options.json);
  const int cores = static_cast<int>(std::max(1U, std::thread::hardware_concurrency()));
  const double clock = kernels::measured_clock_hz(seconds / 2);
  std::vector<LevelFigures> levels;
  for (const kernels::SimdLevel level :
       {kernels::SimdLevel::avx512, kernels::SimdLevel::avx2, kernels::SimdLevel::baseline}) {
    if (static_cast<int>(level) > static_cast<int>(kernels::best_simd_level())) continue;
    LevelFigures f{level, kernels::fma_units(level)};
    f.per_core = kernels::fma_flops_per_second(level, seconds);
    f.all_cores = kernels::fma_flops_per_second_threads(level, cores, seconds);
    f.clock_hz = kernels::measured_clock_hz(seconds / 2, level);
    f.theoretical_per_core = f.clock_hz * f.units.flops_per_cycle();
    levels.push_back(f);
  }
  const std::int64_t elements = triad_bytes / 12;
  const double triad_one = kernels::triad_bytes_per_second(elements, 1);
  const double triad_all = kernels::triad_bytes_per_second(elements, cores);
  const double convert = kernels::bf16_to_f32_per_second(std::int64_t{1} << 22);
  const Bf16Figures bf16 = measure_bf16(levels, seconds);
  if (options.json) {
    nlohmann::json json = {{"machine", kernels::machine_description()},
                           {"cores", cores},
                           {"clock_hz", clock},
                           {"triad_bytes_per_second_one_core", triad_one},
                           {"triad_bytes_per_second", triad_all},
                           {"bf16_to_f32_per_second", convert},
                           {"bf16_dot_products_used", bf16.used},
                           {"bf16_theoretical_flops_per_core", bf16.theoretical_per_core},
                           {"bf16_flops_per_core", bf16.per_core}};
    for (const LevelFigures& f : levels) {
      json["levels"].push_back(
          {{"level", kernels::simd_level_name(f.level)},
           {"microarchitecture", f.units.microarchitecture},
           {"fma_units", f.units.units},
           {"lanes", f.units.lanes},
           {"flops_per_cycle", f.units.flops_per_cycle()},
           {"clock_hz", f.clock_hz},
           {"theoretical_flops_per_core", f.theoretical_per_core},
           {"flops_per_core", f.per_core},
           {"flops_all_cores", f.all_cores},
           {"per_core_of_theoretical", f.per_core / f.theoretical_per_core},
           {"all_cores_of_theoretical", f.all_cores / (cores * f.theoretical_per_core)}});
    }
    std::cout << json.dump() << "\n";
    return;
  }
  std::cout << fmt::format(
      "clock: {:.2f} GHz, measured by a chain of dependent integer additions (one a cycle); each "
      "level's theoretical peak takes the clock measured with that level's FMAs beside the "
      "chain\n",
      clock / 1e9);
  for (const LevelFigures& f : levels) {
    std::cout << fmt::format(
        "f32 FMA, {:<8} {} x {} lanes = {} FLOP/cycle ({}) at {:.2f} GHz: theoretical {:.1f} "
        "GFLOP/s a core; "
        "measured 1 core {:.1f} GFLOP/s ({:.1f}%), {} cores {:.1f} GFLOP/s ({:.1f}%)\n",
        kernels::simd_level_name(f.level), f.units.units, f.units.lanes, f.units.flops_per_cycle(),
        f.units.microarchitecture, f.clock_hz / 1e9, f.theoretical_per_core / 1e9, f.per_core / 1e9,
        100 * f.per_core / f.theoretical_per_core, cores, f.all_cores / 1e9,
        100 * f.all_cores / (cores * f.theoretical_per_core));
  }
  if (bf16.used) {
    std::cout << fmt::format(
        "bf16 dot products (vdpbf16ps, avx512): {} FLOP/cycle, twice the f32 FMA's: theoretical "
        "{:.1f} GFLOP/s a core; measured 1 core {:.1f} GFLOP/s ({:.1f}%): the peak bf16 "
        "compute's MFU divides by\n",
        2 * bf16.flops_per_cycle, bf16.theoretical_per_core / 1e9, bf16.per_core / 1e9,
        100 * bf16.per_core / bf16.theoretical_per_core);
  } else {
    std::cout << "bf16 dot products: not used at this level or on this CPU; bf16 products run "
                 "an emulation on the f32 FMAs (the same bits)\n";
  }
  std::cout << fmt::format(
      "f16 operands: converted to f32 when packed, then the f32 FMA peak above (a bf16 -> f32 "
      "conversion runs at {:.2f} G values/s a core here)\n",
      convert / 1e9);
  std::cout << fmt::format(
      "memory: STREAM triad over 3 arrays of {} MiB: {:.1f} GB/s on 1 core, {:.1f} GB/s on {}\n",
      (elements * 4) >> 20, triad_one / 1e9, triad_all / 1e9, cores);
}

}  // namespace

void add_peak_bench(CLI::App& bench) {
  auto options = std::make_shared<PeakBenchOptions>();
  CLI::App* command = bench.add_subcommand(
      "peak",
      "The machine's limits: f32 FMA FLOP/s per core and on all cores at each SIMD level, and "
      "the bf16 dot-product FLOP/s where bf16 matmuls use them, against the theoretical peak at "
      "the measured clock, and the memory bandwidth (STREAM triad)");
  command->add_option("--seconds", options->seconds, "time of each measurement (default 0.2)");
  command->add_option("--triad-mib", options->triad_mib,
                      "MiB of all three triad arrays (default 256)");
  add_flag(*command, "--json", options->json, "print one JSON object");
  command->callback([options] { run_peak_bench(*options); });
}

}  // namespace meshtensor::cli
