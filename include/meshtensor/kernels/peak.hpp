#pragma once

#include <cstdint>
#include <string>

#include <meshtensor/core/dtype.hpp>
#include <meshtensor/kernels/simd.hpp>

namespace meshtensor::kernels {

/// What one core's FMA units can do in theory: fused multiply-adds of f32 lanes issued per cycle
/// at a SIMD level, from the CPU's vendor and family (a table in docs/performance.md; unknown
/// CPUs: two units of the level's width).
struct FmaUnits {
  std::string microarchitecture;  ///< e.g. "AMD Zen 5 (family 0x1a)"
  int units = 2;                  ///< FMA pipes a core issues to each cycle
  int lanes = 0;                  ///< f32 lanes each FMA of `level` works on
  /// f32 FLOP a core can do per cycle at this level (2 per FMA lane).
  int flops_per_cycle() const { return 2 * units * lanes; }
};

/// The FMA units of this CPU at `level`.
FmaUnits fma_units(SimdLevel level);

/// The core clock measured now, in Hz: a chain of dependent integer additions (one a cycle on
/// every x86-64 core) timed for about `seconds`, under `load`: with an independent FMA of that
/// level's width beside each addition (none at the baseline level), since some cores (Intel's,
/// with their AVX-512 licence) run wide FMAs at a lower clock. 0 where the chain cannot be built
/// (not x86-64); InvalidArgument when this CPU cannot run `load`.
double measured_clock_hz(double seconds = 0.05, SimdLevel load = SimdLevel::baseline);

/// f32 FLOP/s one thread reaches at `level` with a kernel that does nothing but independent
/// fused multiply-adds held in registers (mul and add at the baseline level, which has no FMA),
/// timed for about `seconds`. InvalidArgument when this CPU cannot run the level.
double fma_flops_per_second(SimdLevel level, double seconds = 0.1);

/// f32 FLOP/s of `threads` threads running fma_flops_per_second's kernel at once (their FLOP
/// over the wall time of the slowest).
double fma_flops_per_second_threads(SimdLevel level, int threads, double seconds = 0.1);

/// fma_flops_per_second at the kernels' level (simd_level()), measured once a process (a short
/// measurement on first use): what model FLOPs utilisation figures divide by.
double measured_fma_peak_per_core();

/// FLOP/s one thread reaches with nothing but independent bf16 dot-product instructions
/// (vdpbf16ps: 16 lanes, two products each, counted as 4 FLOP a lane), timed for about
/// `seconds`; 0 where bf16 matmuls do not run on them (bf16_dot_products_used()).
double bf16_dot_flops_per_second(double seconds = 0.1);

/// The peak a product computing in `compute` (f32 or bf16) is measured against, once a process:
/// the bf16 dot-product peak for bf16 where the instruction runs, else the FMA peak.
double measured_compute_peak_per_core(DType compute);

/// Bytes per second of a STREAM triad a[i] = b[i] + s·c[i] over f32 arrays of `elements` each,
/// split over `threads` threads (3 × 4 bytes an element, as STREAM counts), best of `repeats`.
double triad_bytes_per_second(std::int64_t elements, int threads, int repeats = 3);

/// Values per second one thread converts from bf16 to f32 (the packing our bf16 and f16 matmul
/// operands go through before they meet the f32 FMA units), best of a few passes over `elements`.
double bf16_to_f32_per_second(std::int64_t elements);

}  // namespace meshtensor::kernels
