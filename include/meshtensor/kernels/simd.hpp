#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace meshtensor::kernels {

/// Instruction sets the hot kernels are compiled for. Every level gives the same bits: the
/// kernels use exact operations and single correct roundings only, never contraction or
/// reassociation, so a wider vector changes the speed and nothing else.
enum class SimdLevel : std::uint8_t {
  baseline,  ///< what the build targets (x86-64: SSE2)
  avx2,      ///< x86-64 with AVX2 and FMA
  avx512,    ///< x86-64 with AVX-512 (F, DQ, BW, VL)
};

/// "baseline", "avx2" or "avx512".
std::string_view simd_level_name(SimdLevel level);

/// The widest level this CPU runs.
SimdLevel best_simd_level();

/// The level the kernels use now: best_simd_level(), or the environment's MESHTENSOR_SIMD
/// ("baseline", "avx2" or "avx512": a cap, e.g. to measure an AVX2-only CPU's speed on a wider
/// one; the bits are the same), unless set_simd_level() chose another. The first call throws
/// ParseError naming an unknown MESHTENSOR_SIMD, InvalidArgument one this CPU cannot run.
SimdLevel simd_level();

/// Makes the kernels use `level` (tests compare the levels bit for bit; benchmarks time them).
/// Throws InvalidArgument naming the level when this CPU cannot run it.
void set_simd_level(SimdLevel level);

/// The CPU's model name ("AMD EPYC", "Intel(R) Xeon(R) ..."), from /proc/cpuinfo; "unknown CPU"
/// where it is not there. Kernels behave differently on different CPUs, so every benchmark
/// figure names it.
std::string cpu_model();

/// "<cpu model>, N hardware threads, kernels avx512": what a benchmark's figures were measured
/// on.
std::string machine_description();

}  // namespace meshtensor::kernels
