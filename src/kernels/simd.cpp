#include <atomic>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

#include <fmt/format.h>

#include <meshtensor/core/enum_names.hpp>
#include <meshtensor/core/error.hpp>
#include <meshtensor/kernels/simd.hpp>

namespace meshtensor::kernels {

namespace {
constexpr EnumName<SimdLevel> kSimdLevelNames[] = {
    {SimdLevel::baseline, "baseline"}, {SimdLevel::avx2, "avx2"}, {SimdLevel::avx512, "avx512"}};

SimdLevel detect() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl")) {
    return SimdLevel::avx512;
  }
  // The avx2 matmul kernels are built with fused multiply-adds.
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return SimdLevel::avx2;
#endif
  return SimdLevel::baseline;
}

/// The level MESHTENSOR_SIMD caps the kernels at (the best this CPU runs when it is not set).
SimdLevel level_from_environment() {
  const char* text = std::getenv("MESHTENSOR_SIMD");
  if (text == nullptr || *text == '\0') return best_simd_level();
  const SimdLevel asked = parse_enum(kSimdLevelNames, text, "MESHTENSOR_SIMD level");
  if (static_cast<int>(asked) > static_cast<int>(best_simd_level())) {
    throw InvalidArgument(
        fmt::format("MESHTENSOR_SIMD={}: this CPU cannot run the {} kernels (its "
                    "best is {})",
                    text, text, simd_level_name(best_simd_level())));
  }
  return asked;
}

std::atomic<SimdLevel>& current() {
  static std::atomic<SimdLevel> level{level_from_environment()};
  return level;
}
}  // namespace

std::string_view simd_level_name(SimdLevel level) {
  return enum_name(kSimdLevelNames, level, "SIMD level");
}

SimdLevel best_simd_level() {
  static const SimdLevel best = detect();
  return best;
}

SimdLevel simd_level() {
  return current().load(std::memory_order_relaxed);
}

void set_simd_level(SimdLevel level) {
  if (static_cast<int>(level) > static_cast<int>(best_simd_level())) {
    throw InvalidArgument(fmt::format("this CPU cannot run the {} kernels (its best is {})",
                                      simd_level_name(level), simd_level_name(best_simd_level())));
  }
  current().store(level, std::memory_order_relaxed);
}

std::string cpu_model() {
  std::ifstream info("/proc/cpuinfo");
  for (std::string line; std::getline(info, line);) {
    if (line.rfind("model name", 0) != 0) continue;
    const std::size_t colon = line.find(':');
    if (colon == std::string::npos) break;
    const std::size_t start = line.find_first_not_of(" \t", colon + 1);
    return start == std::string::npos ? std::string("unknown CPU") : line.substr(start);
  }
  return "unknown CPU";
}

std::string machine_description() {
  return fmt::format("{}, {} hardware threads, kernels {}", cpu_model(),
                     std::thread::hardware_concurrency(), simd_level_name(simd_level()));
}

}  // namespace meshtensor::kernels
