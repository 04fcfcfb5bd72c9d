#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/core/half.hpp>
#include <meshtensor/kernels/matmul.hpp>
#include <meshtensor/kernels/peak.hpp>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

namespace meshtensor::kernels {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

/// The "vendor_id" and "cpu family" of /proc/cpuinfo ("", -1 where absent).
std::pair<std::string, int> vendor_and_family() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  std::string vendor;
  int family = -1;
  while (std::getline(in, line) && (vendor.empty() || family < 0)) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    const std::string key = line.substr(0, line.find_last_not_of(" \t", colon - 1) + 1);
    const std::string value = colon + 2 <= line.size() ? line.substr(colon + 2) : "";
    if (key == "vendor_id") vendor = value;
    if (key == "cpu family") family = std::atoi(value.c_str());
  }
  return {vendor, family};
}

int level_lanes(SimdLevel level) {
  switch (level) {
    case SimdLevel::avx512:
      return 16;
    case SimdLevel::avx2:
      return 8;
    default:
      return 4;  // SSE2: 4 lanes, a multiply and an add
  }
}

#if defined(__x86_64__) && defined(__GNUC__)
// Independent accumulators, fully unrolled so they stay in registers: enough of them to cover
// the FMA latency on every unit (4-5 cycles x 2 units).
constexpr int kAccumulators512 = 24;
constexpr int kAccumulators256 = 12;

[[gnu::target("avx512f")]] float fma_loop_avx512(std::int64_t iterations) {
  __m512 acc[kAccumulators512];
  const __m512 x = _mm512_set1_ps(0.999999f);
  const __m512 y = _mm512_set1_ps(1e-7f);
  for (int i = 0; i < kAccumulators512; ++i)
    acc[i] = _mm512_set1_ps(static_cast<float>(i));
  for (std::int64_t k = 0; k < iterations; ++k) {
#pragma GCC unroll 24
    for (int i = 0; i < kAccumulators512; ++i)
      acc[i] = _mm512_fmadd_ps(acc[i], x, y);
  }
  __m512 sum = acc[0];
  for (int i = 1; i < kAccumulators512; ++i)
    sum = _mm512_add_ps(sum, acc[i]);
  float out[16];
  _mm512_storeu_ps(out, sum);
  return out[0];
}

[[gnu::target("avx2,fma")]] float fma_loop_avx2(std::int64_t iterations) {
  __m256 acc[kAccumulators256];
  const __m256 x = _mm256_set1_ps(0.999999f);
  const __m256 y = _mm256_set1_ps(1e-7f);
  for (int i = 0; i < kAccumulators256; ++i)
    acc[i] = _mm256_set1_ps(static_cast<float>(i));
  for (std::int64_t k = 0; k < iterations; ++k) {
#pragma GCC unroll 12
    for (int i = 0; i < kAccumulators256; ++i)
      acc[i] = _mm256_fmadd_ps(acc[i], x, y);
  }
  __m256 sum = acc[0];
  for (int i = 1; i < kAccumulators256; ++i)
    sum = _mm256_add_ps(sum, acc[i]);
  float out[8];
  _mm256_storeu_ps(out, sum);
  return out[0];
}

/// The same with the bf16 dot-product instruction: each does 16 lanes of two products and two
/// additions (64 FLOP as bf16 matmuls count them).
[[gnu::target("avx512f,avx512bf16")]] float bf16_dot_loop(std::int64_t iterations) {
  __m512 acc[kAccumulators512];
  const auto x = reinterpret_cast<__m512bh>(_mm512_set1_epi32(0x3A833A83));  // 1e-3 twice
  const auto y = reinterpret_cast<__m512bh>(_mm512_set1_epi32(0x3A833A83));
  for (int i = 0; i < kAccumulators512; ++i)
    acc[i] = _mm512_set1_ps(static_cast<float>(i));
  for (std::int64_t k = 0; k < iterations; ++k) {
#pragma GCC unroll 24
    for (int i = 0; i < kAccumulators512; ++i)
      acc[i] = _mm512_dpbf16_ps(acc[i], x, y);
  }
  __m512 sum = acc[0];
  for (int i = 1; i < kAccumulators512; ++i)
    sum = _mm512_add_ps(sum, acc[i]);
  float out[16];
  _mm512_storeu_ps(out, sum);
  return out[0];
}

float fma_loop_baseline(std::int64_t iterations) {
  __m128 acc[kAccumulators256];
  const __m128 x = _mm_set1_ps(0.999999f);
  const __m128 y = _mm_set1_ps(1e-7f);
  for (int i = 0; i < kAccumulators256; ++i)
    acc[i] = _mm_set1_ps(static_cast<float>(i));
  for (std::int64_t k = 0; k < iterations; ++k) {
#pragma GCC unroll 12
    for (int i = 0; i < kAccumulators256; ++i)
      acc[i] = _mm_add_ps(_mm_mul_ps(acc[i], x), y);
  }
  __m128 sum = acc[0];
  for (int i = 1; i < kAccumulators256; ++i)
    sum = _mm_add_ps(sum, acc[i]);
  return _mm_cvtss_f32(sum);
}

// The clock chains: 32 dependent register-to-register additions an iteration, one a cycle (the
// loop's own counter runs beside them). The addend is a register, not an immediate: Intel cores
// since Golden Cove fold chains of immediate additions at register renaming, several a cycle.
// Under a level's load each addition has an independent FMA of that width beside it (8 chains of
// FMAs, each waiting 8 cycles for its previous result): a core that lowers its clock for wide
// FMAs (Intel's AVX-512 licence) lowers it here too, and the FMA pipes never hold the chain back.
constexpr int kChainAdditions = 32;

std::uint64_t clock_chain(std::int64_t iterations) {
  std::uint64_t x = 0;
  std::uint64_t step = 1;
  for (std::int64_t k = 0; k < iterations; ++k) {
    asm volatile(
        ".rept 32\n\t"
        "add %1, %0\n\t"
        ".endr"
        : "+r"(x), "+r"(step));
  }
  return x;
}

template <typename Vector>
[[gnu::always_inline]] inline std::uint64_t clock_chain_with_fmas(std::int64_t iterations,
                                                                  Vector one, Vector scale,
                                                                  Vector shift) {
  std::uint64_t x = 0;
  std::uint64_t step = 1;
  Vector a0 = one, a1 = one, a2 = one, a3 = one, a4 = one, a5 = one, a6 = one, a7 = one;
  for (std::int64_t k = 0; k < iterations; ++k) {
    asm volatile(
        ".rept 4\n\t"
        "add %1, %0\n\tvfmadd213ps %11, %10, %2\n\tadd %1, %0\n\tvfmadd213ps %11, %10, %3\n\t"
        "add %1, %0\n\tvfmadd213ps %11, %10, %4\n\tadd %1, %0\n\tvfmadd213ps %11, %10, %5\n\t"
        "add %1, %0\n\tvfmadd213ps %11, %10, %6\n\tadd %1, %0\n\tvfmadd213ps %11, %10, %7\n\t"
        "add %1, %0\n\tvfmadd213ps %11, %10, %8\n\tadd %1, %0\n\tvfmadd213ps %11, %10, %9\n\t"
        ".endr"
        : "+r"(x), "+r"(step), "+v"(a0), "+v"(a1), "+v"(a2), "+v"(a3), "+v"(a4), "+v"(a5), "+v"(a6),
          "+v"(a7)
        : "v"(scale), "v"(shift));
  }
  return x;
}

[[gnu::target("avx512f")]] std::uint64_t clock_chain_avx512(std::int64_t iterations) {
  return clock_chain_with_fmas(iterations, _mm512_set1_ps(1.0f), _mm512_set1_ps(0.999999f),
                               _mm512_set1_ps(1e-7f));
}

[[gnu::target("avx2,fma")]] std::uint64_t clock_chain_avx2(std::int64_t iterations) {
  return clock_chain_with_fmas(iterations, _mm256_set1_ps(1.0f), _mm256_set1_ps(0.999999f),
                               _mm256_set1_ps(1e-7f));
}

/// Runs the clock chain for `iterations` under `load`'s FMAs (none at the baseline level).
void run_clock_chain(SimdLevel load, std::int64_t iterations) {
  volatile std::uint64_t sink = 0;
  switch (load) {
    case SimdLevel::avx512:
      sink = clock_chain_avx512(iterations);
      break;
    case SimdLevel::avx2:
      sink = clock_chain_avx2(iterations);
      break;
    default:
      sink = clock_chain(iterations);
      break;
  }
  (void)sink;
}
#endif

/// f32 FLOP of one iteration of the level's loop.
double flops_per_iteration(SimdLevel level) {
#if defined(__x86_64__) && defined(__GNUC__)
  switch (level) {
    case SimdLevel::avx512:
      return 2.0 * 16 * kAccumulators512;
    case SimdLevel::avx2:
      return 2.0 * 8 * kAccumulators256;
    default:
      return 2.0 * 4 * kAccumulators256;
  }
#else
  (void)level;
  return 2.0;
#endif
}

/// Runs the level's loop for `iterations`; returns its f32 FLOP.
double run_fma_loop(SimdLevel level, std::int64_t iterations, volatile float& sink) {
#if defined(__x86_64__) && defined(__GNUC__)
  switch (level) {
    case SimdLevel::avx512:
      sink = fma_loop_avx512(iterations);
      break;
    case SimdLevel::avx2:
      sink = fma_loop_avx2(iterations);
      break;
    default:
      sink = fma_loop_baseline(iterations);
      break;
  }
#else
  float a = 1.0f;
  for (std::int64_t k = 0; k < iterations; ++k)
    a = a * 0.999999f + 1e-7f;
  sink = a;
#endif
  return flops_per_iteration(level) * static_cast<double>(iterations);
}

void check_level(SimdLevel level) {
  if (static_cast<int>(level) > static_cast<int>(best_simd_level())) {
    throw InvalidArgument(fmt::format("this CPU cannot run the {} level (its best is {})",
                                      simd_level_name(level), simd_level_name(best_simd_level())));
  }
}

/// Iterations of `run(iterations)` that take about `seconds` (grown from a short trial).
template <class Run>
std::int64_t iterations_lasting(double seconds, Run run) {
  std::int64_t iterations = 1 << 14;
  for (;;) {
    const auto start = Clock::now();
    run(iterations);
    const double took = seconds_since(start);
    if (took > seconds / 8 || iterations > (std::int64_t{1} << 40))
      return static_cast<std::int64_t>(static_cast<double>(iterations) * seconds /
                                       std::max(took, 1e-9));
    iterations *= 4;
  }
}

/// Iterations of the level's loop that take about `seconds`.
std::int64_t iterations_for(SimdLevel level, double seconds) {
  volatile float sink = 0;
  return iterations_lasting(seconds, [&](std::int64_t n) { run_fma_loop(level, n, sink); });
}

}  // namespace

FmaUnits fma_units(SimdLevel level) {
  const auto [vendor, family] = vendor_and_family();
  FmaUnits units;
  units.lanes = level_lanes(level);
  units.units = 2;
  if (vendor == "AuthenticAMD") {
    if (family == 0x1a) {
      units.microarchitecture = "AMD Zen 5 (family 0x1a)";  // 2 FMA pipes, 512 bits wide
    } else if (family == 0x19) {
      // Zen 3 and 4: 2 FMA pipes of 256 bits; Zen 4 runs a 512-bit FMA over two cycles.
      units.microarchitecture = "AMD Zen 3/4 (family 0x19)";
      if (level == SimdLevel::avx512) units.units = 1;
    } else if (family == 0x17) {
      units.microarchitecture = "AMD Zen 1/2 (family 0x17)";
    } else {
      units.microarchitecture = fmt::format("AMD family {:#x}", family);
    }
  } else if (vendor == "GenuineIntel") {
    units.microarchitecture =
        fmt::format("Intel family {} (2 FMA ports assumed, as server cores have)", family);
  } else {
    units.microarchitecture = "unknown (2 FMA units assumed)";
  }
  if (level == SimdLevel::baseline) units.microarchitecture += ", SSE2 multiply + add";
  return units;
}

double measured_clock_hz(double seconds, SimdLevel load) {
#if defined(__x86_64__) && defined(__GNUC__)
  check_level(load);
  std::int64_t iterations = 1 << 12;
  for (;;) {
    const auto start = Clock::now();
    run_clock_chain(load, iterations);
    const double took = seconds_since(start);
    if (took > seconds / 3 || iterations > (std::int64_t{1} << 40)) break;
    iterations *= 2;
  }
  double best = 0.0;  // the best of three: time another thread takes from the core only lowers it
  for (int round = 0; round < 3; ++round) {
    const auto start = Clock::now();
    run_clock_chain(load, iterations);
    best = std::max(best, kChainAdditions * static_cast<double>(iterations) / seconds_since(start));
  }
  return best;
#else
  (void)seconds;
  (void)load;
  return 0.0;
#endif
}

double fma_flops_per_second(SimdLevel level, double seconds) {
  return fma_flops_per_second_threads(level, 1, seconds);
}

double fma_flops_per_second_threads(SimdLevel level, int threads, double seconds) {
  check_level(level);
  if (threads < 1) throw InvalidArgument(fmt::format("{} threads: at least 1", threads));
  const std::int64_t iterations = iterations_for(level, seconds);
  double best = 0.0;
  for (int round = 0; round < 3; ++round) {  // the best of three: a first one may meet a slow clock
    std::vector<std::thread> workers;
    const auto start = Clock::now();
    for (int t = 0; t < threads; ++t) {
      workers.emplace_back([&] {
        volatile float sink = 0;
        run_fma_loop(level, iterations, sink);
      });
    }
    for (std::thread& w : workers)
      w.join();
    const double took = seconds_since(start);
    const double flops = flops_per_iteration(level) * static_cast<double>(iterations);
    best = std::max(best, flops * threads / took);
  }
  return best;
}

double bf16_dot_flops_per_second(double seconds) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (!bf16_dot_products_used()) return 0.0;
  constexpr double kFlopsPerIteration = 64.0 * kAccumulators512;
  volatile float sink = 0;
  const auto run = [&](std::int64_t n) { sink = bf16_dot_loop(n); };
  const std::int64_t iterations = iterations_lasting(seconds, run);
  double best = 0.0;  // the best of three, as for the FMAs
  for (int round = 0; round < 3; ++round) {
    const auto start = Clock::now();
    run(iterations);
    best =
        std::max(best, kFlopsPerIteration * static_cast<double>(iterations) / seconds_since(start));
  }
  (void)sink;
  return best;
#else
  (void)seconds;
  return 0.0;
#endif
}

double measured_compute_peak_per_core(DType compute) {
  if (compute == DType::bf16 && bf16_dot_products_used()) {
    static const double bf16_peak = bf16_dot_flops_per_second(0.02);
    return bf16_peak;
  }
  return measured_fma_peak_per_core();
}

double measured_fma_peak_per_core() {
  static const double peak = fma_flops_per_second(simd_level(), 0.02);
  return peak;
}

double triad_bytes_per_second(std::int64_t elements, int threads, int repeats) {
  if (elements < 1 || threads < 1)
    throw InvalidArgument(fmt::format("a triad of {} elements on {} threads", elements, threads));
  std::vector<float> a(static_cast<std::size_t>(elements));
  std::vector<float> b(a.size(), 1.0f);
  std::vector<float> c(a.size(), 2.0f);
  const float s = 3.0f;
  const auto part = [&](int t, std::size_t& first, std::size_t& last) {
    const std::size_t n = a.size();
    first = n * static_cast<std::size_t>(t) / static_cast<std::size_t>(threads);
    last = n * static_cast<std::size_t>(t + 1) / static_cast<std::size_t>(threads);
  };
  double best = 0.0;
  for (int r = 0; r < repeats + 1; ++r) {  // the first pass faults the pages in
    std::vector<std::thread> workers;
    const auto start = Clock::now();
    for (int t = 0; t < threads; ++t) {
      workers.emplace_back([&, t] {
        std::size_t first = 0;
        std::size_t last = 0;
        part(t, first, last);
        for (std::size_t i = first; i < last; ++i)
          a[i] = b[i] + s * c[i];
      });
    }
    for (std::thread& w : workers)
      w.join();
    const double took = seconds_since(start);
    if (r > 0) best = std::max(best, 12.0 * static_cast<double>(elements) / took);
  }
  volatile float keep = a[a.size() / 2];
  (void)keep;
  return best;
}

double bf16_to_f32_per_second(std::int64_t elements) {
  if (elements < 1) throw InvalidArgument(fmt::format("{} values to convert", elements));
  std::vector<std::uint16_t> in(static_cast<std::size_t>(elements));
  for (std::size_t i = 0; i < in.size(); ++i)
    in[i] = static_cast<std::uint16_t>(0x3f80 + (i & 0x7f));
  std::vector<float> out(in.size());
  double best = 0.0;
  for (int r = 0; r < 4; ++r) {
    const auto start = Clock::now();
    for (std::size_t i = 0; i < in.size(); ++i) {
      const std::uint32_t bits = static_cast<std::uint32_t>(in[i]) << 16;
      std::memcpy(&out[i], &bits, sizeof bits);
    }
    const double took = seconds_since(start);
    if (r > 0) best = std::max(best, static_cast<double>(elements) / took);
  }
  volatile float keep = out[out.size() / 2];
  (void)keep;
  return best;
}

}  // namespace meshtensor::kernels
