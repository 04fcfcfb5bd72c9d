#include "matmul_bf16.hpp"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "matmul_tiles.hpp"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define MESHTENSOR_X86_KERNELS 1
#endif

#include <meshtensor/kernels/matmul.hpp>
#include <meshtensor/kernels/simd.hpp>

// The chain every element follows, whatever runs it (the bf16 dot-product instruction's, as
// measured on the CPUs that have it): k is padded with zeros to an even length and taken in pairs;
// for each pair, acc = FTZ(fma(a[k+1], b[k+1], acc)), then acc = FTZ(fma(a[k], b[k], acc)), where
// FTZ flushes a subnormal to the zero of its sign. Subnormal inputs count as zeros of their sign
// (packing flushes them), and so does a subnormal starting value. A bf16 product is exact in f32
// arithmetic's fma, so each step is one correct rounding of acc plus the exact product.

namespace meshtensor::kernels {

#if MESHTENSOR_X86_KERNELS
namespace detail {
bool instruction_matches_chain();
bool cpu_has_bf16_dot_products();
}  // namespace detail
#endif

namespace {
std::atomic<bool> instruction_allowed{true};
}  // namespace

void allow_bf16_dot_products(bool allowed) {
  instruction_allowed = allowed;
}

bool bf16_dot_products_used() {
#if MESHTENSOR_X86_KERNELS
  static const bool usable =
      detail::cpu_has_bf16_dot_products() && detail::instruction_matches_chain();
  return usable && instruction_allowed && simd_level() == SimdLevel::avx512;
#else
  return false;
#endif
}

namespace detail {

namespace {

/// Two bf16 of one row, k even in the low half and k + 1 in the high half, as the instruction
/// reads them.
using Pair = std::uint32_t;

/// A subnormal bf16 becomes the zero of its sign.
std::uint16_t flushed(std::uint16_t bits) {
  return (bits & 0x7F80U) == 0 ? static_cast<std::uint16_t>(bits & 0x8000U) : bits;
}

#if MESHTENSOR_X86_KERNELS
/// Flushes the subnormal halves of `count` pairs to the zeros of their signs, 8 at a time.
[[gnu::target("avx2")]] void flush_pairs_avx2(Pair* pairs, std::int64_t count) {
  const __m256i exponent = _mm256_set1_epi16(0x7F80);
  const __m256i magnitude = _mm256_set1_epi16(0x7FFF);
  std::int64_t i = 0;
  for (; i + 8 <= count; i += 8) {
    auto* at = reinterpret_cast<__m256i*>(pairs + i);
    const __m256i x = _mm256_loadu_si256(at);
    const __m256i tiny = _mm256_cmpeq_epi16(_mm256_and_si256(x, exponent), _mm256_setzero_si256());
    _mm256_storeu_si256(at, _mm256_andnot_si256(_mm256_and_si256(tiny, magnitude), x));
  }
  for (; i < count; ++i)
    pairs[i] = flushed(static_cast<std::uint16_t>(pairs[i])) |
               (Pair{flushed(static_cast<std::uint16_t>(pairs[i] >> 16))} << 16);
}

/// A full panel of 8 rows of a row-major source (the pairs of a row side by side): 8 x 8 blocks
/// of pairs transposed in registers, then flushed.
[[gnu::target("avx2")]] void pack_panel_of_rows_avx2(const std::uint16_t* first,
                                                     std::int64_t row_stride, std::int64_t pairs,
                                                     Pair* out) {
  const auto* source = reinterpret_cast<const float*>(first);  // pairs as 32-bit lanes
  const std::int64_t stride = row_stride / 2;
  std::int64_t p = 0;
  for (; p + 8 <= pairs; p += 8)
    transpose_8x8(source + p, stride, reinterpret_cast<float*>(out + p * 8), 8);
  for (; p < pairs; ++p)
    for (std::int64_t r = 0; r < 8; ++r)
      out[p * 8 + r] = std::bit_cast<Pair>(source[r * stride + p]);
  flush_pairs_avx2(out, pairs * 8);
}
#endif

/// Packs rows [row0, row0 + rows) of op(x) (zero-padded to `width` rows) over the columns
/// [col0, col0 + 2·pairs) as out[p·width + r] = the pair (x[r][col0 + 2p], x[r][col0 + 2p + 1]);
/// columns at or past `cols` read zero.
void pack_pairs(const Bf16Operand& x, std::int64_t row0, std::int64_t rows, std::int64_t width,
                std::int64_t col0, std::int64_t pairs, std::int64_t cols, Pair* out) {
  const auto at = [&](std::int64_t r, std::int64_t c) -> Pair {
    return c < cols ? flushed(x.data[(row0 + r) * x.row_stride + c * x.col_stride]) : 0U;
  };
#if MESHTENSOR_X86_KERNELS
  if (x.col_stride == 1 && x.row_stride % 2 == 0 && rows == 8 && width == 8 &&
      col0 + 2 * pairs <= cols && simd_level() != SimdLevel::baseline) {
    return pack_panel_of_rows_avx2(x.data + row0 * x.row_stride + col0, x.row_stride, pairs, out);
  }
#endif
  if (x.row_stride == 1 && col0 + 2 * pairs <= cols) {
    // Rows side by side in memory (a weight's columns, a transposed input's features): each
    // pair interleaves two lines, which vectorises.
    for (std::int64_t p = 0; p < pairs; ++p) {
      const std::uint16_t* even = x.data + (col0 + 2 * p) * x.col_stride + row0;
      const std::uint16_t* odd = even + x.col_stride;
      Pair* to = out + p * width;
      for (std::int64_t r = 0; r < rows; ++r)
        to[r] = flushed(even[r]) | (Pair{flushed(odd[r])} << 16);
      for (std::int64_t r = rows; r < width; ++r)
        to[r] = 0U;
    }
    return;
  }
  for (std::int64_t r = 0; r < rows; ++r) {
    if (x.col_stride == 1 && col0 + 2 * pairs <= cols) {
      const std::uint16_t* line = x.data + (row0 + r) * x.row_stride + col0;
      for (std::int64_t p = 0; p < pairs; ++p)
        out[p * width + r] = flushed(line[2 * p]) | (Pair{flushed(line[2 * p + 1])} << 16);
      continue;
    }
    for (std::int64_t p = 0; p < pairs; ++p)
      out[p * width + r] = at(r, col0 + 2 * p) | (at(r, col0 + 2 * p + 1) << 16);
  }
  for (std::int64_t r = rows; r < width; ++r)
    for (std::int64_t p = 0; p < pairs; ++p)
      out[p * width + r] = 0U;
}

/// Packs rows [row0, row0 + rows) of op(x) as consecutive panels of `width` rows (the last
/// zero-padded), panel q at out + q·pairs·width laid out as pack_pairs lays one. Rows side by side
/// in memory are walked once along their lines for all panels, so each line read serves every
/// panel rather than a few rows of one.
void pack_pair_panels(const Bf16Operand& x, std::int64_t row0, std::int64_t rows,
                      std::int64_t width, std::int64_t col0, std::int64_t pairs, std::int64_t cols,
                      Pair* out) {
  const std::int64_t panels = (rows + width - 1) / width;
  if (x.row_stride == 1 && panels > 1 && col0 + 2 * pairs <= cols) {
    for (std::int64_t p = 0; p < pairs; ++p) {
      const std::uint16_t* even = x.data + (col0 + 2 * p) * x.col_stride + row0;
      const std::uint16_t* odd = even + x.col_stride;
      for (std::int64_t q = 0; q < panels; ++q) {
        Pair* to = out + q * pairs * width + p * width;
        const std::int64_t first = q * width;
        const std::int64_t take = std::min(width, rows - first);
        for (std::int64_t r = 0; r < take; ++r)
          to[r] = flushed(even[first + r]) | (Pair{flushed(odd[first + r])} << 16);
        for (std::int64_t r = take; r < width; ++r)
          to[r] = 0U;
      }
    }
    return;
  }
  for (std::int64_t q = 0; q < panels; ++q) {
    const std::int64_t first = row0 + q * width;
    pack_pairs(x, first, std::min(width, row0 + rows - first), width, col0, pairs, cols,
               out + q * pairs * width);
  }
}

/// The transpose of an operand.
Bf16Operand transposed(Bf16Operand x) {
  std::swap(x.row_stride, x.col_stride);
  return x;
}

/// Runs `pairs` steps on one mr x nr tile: a is a packed panel [pairs][mr], b a packed strip
/// [pairs][nr], c the tile (row stride ldc); chains start from init (row r at init + r·ld_init;
/// ld_init 0: one row for all) or from +0 where it is null.
using PairKernel = void (*)(std::int64_t pairs, const Pair* a, const Pair* b, float* c,
                            std::int64_t ldc, const float* init, std::int64_t ld_init);

struct PairShape {
  int mr = 0;
  int nr = 0;
  PairKernel run = nullptr;
};

float low_half(Pair p) {
  return std::bit_cast<float>(p << 16);
}
float high_half(Pair p) {
  return std::bit_cast<float>(p & 0xFFFF0000U);
}
float flush_to_zero(float x) {
  return std::fabs(x) < std::numeric_limits<float>::min() ? std::copysign(0.0f, x) : x;
}

/// The chain in portable arithmetic (std::fma is correctly rounded).
template <int MR, int NR>
void pairs_scalar(std::int64_t pairs, const Pair* a, const Pair* b, float* c, std::int64_t ldc,
                  const float* init, std::int64_t ld_init) {
  float acc[MR][NR];
  for (int r = 0; r < MR; ++r)
    for (int j = 0; j < NR; ++j)
      acc[r][j] = init != nullptr ? init[r * ld_init + j] : 0.0f;
  if (pairs > 0) {
    for (int r = 0; r < MR; ++r)
      for (int j = 0; j < NR; ++j)
        acc[r][j] = flush_to_zero(acc[r][j]);
  }
  for (std::int64_t p = 0; p < pairs; ++p, a += MR, b += NR) {
    for (int r = 0; r < MR; ++r) {
      for (int j = 0; j < NR; ++j) {
        float s = flush_to_zero(std::fma(high_half(a[r]), high_half(b[j]), acc[r][j]));
        acc[r][j] = flush_to_zero(std::fma(low_half(a[r]), low_half(b[j]), s));
      }
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int j = 0; j < NR; ++j)
      c[r * ldc + j] = acc[r][j];
}

#if MESHTENSOR_X86_KERNELS
// GCC 12 takes the _mm512_undefined_epi32() inside the shift intrinsics for uninitialised reads.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#define MESHTENSOR_BF16_HW gnu::target("avx512f,avx512bf16")
#define MESHTENSOR_AVX512_EMU gnu::target("avx512f,avx512dq,fma")
#define MESHTENSOR_AVX2_EMU gnu::target("avx2,fma")

/// The instruction itself: 16 lanes of one vdpbf16ps per row and vector per pair.
template <int MR, int NV>
[[MESHTENSOR_BF16_HW]] void pairs_instruction(std::int64_t pairs, const Pair* a, const Pair* b,
                                              float* c, std::int64_t ldc, const float* init,
                                              std::int64_t ld_init) {
  __m512 acc[MR][NV];
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v)
      acc[r][v] =
          init != nullptr ? _mm512_loadu_ps(init + r * ld_init + v * 16) : _mm512_setzero_ps();
  }
  for (std::int64_t p = 0; p < pairs; ++p, a += MR, b += NV * 16) {
    __m512bh bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v)
      bv[v] = reinterpret_cast<__m512bh>(_mm512_loadu_si512(b + v * 16));
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      const auto ar = reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(a[r])));
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v)
        acc[r][v] = _mm512_dpbf16_ps(acc[r][v], ar, bv[v]);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v)
      _mm512_storeu_ps(c + r * ldc + v * 16, acc[r][v]);
  }
}

/// The chain emulated with AVX-512F's fma and a flush after each step.
struct Avx512Emulation {
  using V = __m512;
  static constexpr int kLanes = 16;
  [[MESHTENSOR_AVX512_EMU, gnu::always_inline]] static V load(const float* p) {
    return _mm512_loadu_ps(p);
  }
  [[MESHTENSOR_AVX512_EMU, gnu::always_inline]] static void store(float* p, V v) {
    _mm512_storeu_ps(p, v);
  }
  [[MESHTENSOR_AVX512_EMU, gnu::always_inline]] static V zero() { return _mm512_setzero_ps(); }
  [[MESHTENSOR_AVX512_EMU, gnu::always_inline]] static V high(const Pair* p) {
    return _mm512_castsi512_ps(
        _mm512_and_si512(_mm512_loadu_si512(p), _mm512_set1_epi32(static_cast<int>(0xFFFF0000U))));
  }
  [[MESHTENSOR_AVX512_EMU, gnu::always_inline]] static V low(const Pair* p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_loadu_si512(p), 16));
  }
  [[MESHTENSOR_AVX512_EMU, gnu::always_inline]] static V broadcast(float x) {
    return _mm512_set1_ps(x);
  }
  [[MESHTENSOR_AVX512_EMU, gnu::always_inline]] static V flush(V x) {
    const __m512 magnitude = _mm512_castsi512_ps(
        _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(0x7FFFFFFF)));
    const __mmask16 tiny = _mm512_cmp_ps_mask(magnitude, _mm512_set1_ps(0x1p-126f), _CMP_LT_OQ);
    return _mm512_mask_and_ps(x, tiny, x, _mm512_set1_ps(-0.0f));
  }
  [[MESHTENSOR_AVX512_EMU, gnu::always_inline]] static V step(V a, V b, V acc) {
    return flush(_mm512_fmadd_ps(a, b, acc));
  }
};

/// The same with AVX2.
struct Avx2Emulation {
  using V = __m256;
  static constexpr int kLanes = 8;
  [[MESHTENSOR_AVX2_EMU, gnu::always_inline]] static V load(const float* p) {
    return _mm256_loadu_ps(p);
  }
  [[MESHTENSOR_AVX2_EMU, gnu::always_inline]] static void store(float* p, V v) {
    _mm256_storeu_ps(p, v);
  }
  [[MESHTENSOR_AVX2_EMU, gnu::always_inline]] static V zero() { return _mm256_setzero_ps(); }
  [[MESHTENSOR_AVX2_EMU, gnu::always_inline]] static V high(const Pair* p) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm256_castsi256_ps(
        _mm256_and_si256(v, _mm256_set1_epi32(static_cast<int>(0xFFFF0000U))));
  }
  [[MESHTENSOR_AVX2_EMU, gnu::always_inline]] static V low(const Pair* p) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
  }
  [[MESHTENSOR_AVX2_EMU, gnu::always_inline]] static V broadcast(float x) {
    return _mm256_set1_ps(x);
  }
  [[MESHTENSOR_AVX2_EMU, gnu::always_inline]] static V flush(V x) {
    const V sign = _mm256_set1_ps(-0.0f);
    const V tiny = _mm256_cmp_ps(_mm256_andnot_ps(sign, x), _mm256_set1_ps(0x1p-126f), _CMP_LT_OQ);
    return _mm256_blendv_ps(x, _mm256_and_ps(x, sign), tiny);
  }
  [[MESHTENSOR_AVX2_EMU, gnu::always_inline]] static V step(V a, V b, V acc) {
    return flush(_mm256_fmadd_ps(a, b, acc));
  }
};

#define MESHTENSOR_PAIRS_EMULATED(name, attribute, Level)                                        \
  template <int MR, int NV>                                                                      \
  [[attribute]] void name(std::int64_t pairs, const Pair* a, const Pair* b, float* c,            \
                          std::int64_t ldc, const float* init, std::int64_t ld_init) {           \
    using V = Level::V;                                                                          \
    constexpr int kLanes = Level::kLanes;                                                        \
    V acc[MR][NV];                                                                               \
    _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) {                                      \
      _Pragma("GCC unroll 4") for (int v = 0; v < NV; ++v) {                                     \
        acc[r][v] = init != nullptr ? Level::flush(Level::load(init + r * ld_init + v * kLanes)) \
                                    : Level::zero();                                             \
      }                                                                                          \
    }                                                                                            \
    for (std::int64_t p = 0; p < pairs; ++p, a += MR, b += NV * kLanes) {                        \
      V high[NV];                                                                                \
      V low[NV];                                                                                 \
      _Pragma("GCC unroll 4") for (int v = 0; v < NV; ++v) {                                     \
        high[v] = Level::high(b + v * kLanes);                                                   \
        low[v] = Level::low(b + v * kLanes);                                                     \
      }                                                                                          \
      _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) {                                    \
        const V ah = Level::broadcast(high_half(a[r]));                                          \
        const V al = Level::broadcast(low_half(a[r]));                                           \
        _Pragma("GCC unroll 4") for (int v = 0; v < NV; ++v) {                                   \
          acc[r][v] = Level::step(al, low[v], Level::step(ah, high[v], acc[r][v]));              \
        }                                                                                        \
      }                                                                                          \
    }                                                                                            \
    _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) {                                      \
      _Pragma("GCC unroll 4") for (int v = 0; v < NV; ++v) {                                     \
        Level::store(c + r * ldc + v * kLanes, acc[r][v]);                                       \
      }                                                                                          \
    }                                                                                            \
  }

MESHTENSOR_PAIRS_EMULATED(pairs_avx512, MESHTENSOR_AVX512_EMU, Avx512Emulation)
MESHTENSOR_PAIRS_EMULATED(pairs_avx2, MESHTENSOR_AVX2_EMU, Avx2Emulation)
#undef MESHTENSOR_PAIRS_EMULATED
#pragma GCC diagnostic pop
#endif

/// Runs one tile of `rows` x `cols` (at most mr x nr) at `tile`, through a full-size copy when
/// it is an edge tile.
void run_tile(const PairShape& shape, std::int64_t pairs, const Pair* panel, const Pair* strip,
              std::int64_t rows, std::int64_t cols, float* tile, std::int64_t ldc,
              std::pair<const float*, std::int64_t> init) {
  if (rows == shape.mr && cols == shape.nr) {
    shape.run(pairs, panel, strip, tile, ldc, init.first, init.second);
    return;
  }
  thread_local std::vector<float> edge;
  edge.resize(static_cast<std::size_t>(shape.mr * shape.nr));
  run_on_edge(
      [&](float* out, const float* from) {
        shape.run(pairs, panel, strip, out, shape.nr, from, shape.nr);
      },
      edge, shape.nr, rows, cols, tile, ldc, init);
}

/// The whole product with one tile shape (blocked as gemm() blocks f32: any blocking gives the
/// same bits, each chain going on from c after the first block of k).
void gemm_pairs(const PairShape& shape, std::int64_t m, std::int64_t n, std::int64_t k,
                const Bf16Operand& a, const Bf16Operand& b, float* c, std::int64_t ldc,
                Seed<float> seed) {
  constexpr std::int64_t kBlockPairs = 256;
  const std::int64_t mr = shape.mr;
  const std::int64_t nr = shape.nr;
  const std::int64_t block_n = nr * (1024 / nr);
  const std::int64_t block_m = mr * (96 / mr);
  const std::int64_t all_pairs = (k + 1) / 2;
  thread_local std::vector<Pair> packed_a;
  thread_local std::vector<Pair> packed_b;
  packed_a.resize(static_cast<std::size_t>(kBlockPairs * block_m));
  packed_b.resize(static_cast<std::size_t>(kBlockPairs * block_n));
  for (std::int64_t pc = 0; pc < all_pairs; pc += kBlockPairs) {
    const std::int64_t pairs = std::min(kBlockPairs, all_pairs - pc);
    const Seed<float> start = pc == 0 ? seed : Seed<float>{true, nullptr};
    for (std::int64_t jc = 0; jc < n; jc += block_n) {
      const std::int64_t nc = std::min(block_n, n - jc);
      const std::int64_t strips = (nc + nr - 1) / nr;
      pack_pair_panels(transposed(b), jc, nc, nr, 2 * pc, pairs, k, packed_b.data());
      for (std::int64_t ic = 0; ic < m; ic += block_m) {
        const std::int64_t mc = std::min(block_m, m - ic);
        const std::int64_t panels = (mc + mr - 1) / mr;
        for (std::int64_t q = 0; q < panels; ++q) {
          const std::int64_t row0 = ic + q * mr;
          pack_pairs(a, row0, std::min(mr, m - row0), mr, 2 * pc, pairs, k,
                     packed_a.data() + q * pairs * mr);
        }
        for (std::int64_t s = 0; s < strips; ++s) {
          const std::int64_t col0 = jc + s * nr;
          for (std::int64_t p = 0; p < panels; ++p) {
            const std::int64_t row0 = ic + p * mr;
            run_tile(shape, pairs, packed_a.data() + p * pairs * mr,
                     packed_b.data() + s * pairs * nr, std::min(mr, m - row0),
                     std::min(nr, n - col0), c + row0 * ldc + col0, ldc,
                     start.at(c, ldc, row0, col0));
          }
        }
      }
    }
  }
}

}  // namespace

#if MESHTENSOR_X86_KERNELS
bool cpu_has_bf16_dot_products() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512bf16") != 0;
}

/// Whether the instruction follows the chain above on this CPU: the portable chain and the
/// instruction on values that tell each rule apart (the order within a pair, fused steps,
/// subnormal starts, products and results, signed zeros) and on random ones across the exponent
/// range. A CPU that differs keeps the portable chain, so the bits never depend on the CPU.
bool instruction_matches_chain() {
  constexpr int kPairs = 64;
  constexpr int kRows = 8;
  constexpr int kCols = 32;
  std::vector<Pair> a(static_cast<std::size_t>(kPairs * kRows));
  std::vector<Pair> b(static_cast<std::size_t>(kPairs * kCols));
  std::vector<float> init(static_cast<std::size_t>(kRows * kCols));
  std::uint64_t state = 0x9E3779B97F4A7C15ULL;
  const auto next = [&] {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
  };
  // Exponents over the whole range, so products and sums land subnormal and cancel; every
  // value a bf16 of either sign with its subnormals flushed, as packing leaves them.
  const auto value = [&] {
    const auto bits = static_cast<std::uint16_t>(next());
    const auto exponent =
        static_cast<std::uint16_t>((next() % 3 == 0 ? 0x3F00U : 0x0080U) + ((next() % 200) << 7));
    return flushed(static_cast<std::uint16_t>((bits & 0x807FU) | (exponent & 0x7F80U)));
  };
  for (Pair& x : a)
    x = value() | (Pair{value()} << 16);
  for (Pair& x : b)
    x = value() | (Pair{value()} << 16);
  for (std::size_t i = 0; i < init.size(); ++i) {
    const std::uint32_t bits = static_cast<std::uint32_t>(next());
    // Subnormal, signed-zero and normal starts.
    init[i] = std::bit_cast<float>(i % 4 == 0   ? bits & 0x807FFFFFU
                                   : i % 4 == 1 ? bits & 0x80000000U
                                                : bits & 0xBFFFFFFFU);
  }
  // Row 0 pairs a large value with its negative and a small one: the order within a pair and
  // whether a step is rounded show in the result.
  a[0] = 0x3F80U | (Pair{0x4B80U} << 16);
  b[0] = 0x3F80U | (Pair{0x3F80U} << 16);
  a[kRows] = 0x0000U | (Pair{0xCB80U} << 16);
  std::vector<float> hardware(init.size());
  std::vector<float> portable(init.size());
  for (const std::int64_t pairs : {std::int64_t{1}, std::int64_t{2}, std::int64_t{kPairs}}) {
    pairs_instruction<kRows, 2>(pairs, a.data(), b.data(), hardware.data(), kCols, init.data(),
                                kCols);
    pairs_scalar<kRows, kCols>(pairs, a.data(), b.data(), portable.data(), kCols, init.data(),
                               kCols);
    for (std::size_t i = 0; i < init.size(); ++i) {
      const bool both_nan = std::isnan(hardware[i]) && std::isnan(portable[i]);
      if (!both_nan &&
          std::bit_cast<std::uint32_t>(hardware[i]) != std::bit_cast<std::uint32_t>(portable[i]))
        return false;
    }
  }
  return true;
}
#endif

namespace {

PairShape pair_shape() {
#if MESHTENSOR_X86_KERNELS
  if (bf16_dot_products_used()) return {8, 32, &pairs_instruction<8, 2>};
  if (simd_level() == SimdLevel::avx512) return {8, 32, &pairs_avx512<8, 2>};
  if (simd_level() == SimdLevel::avx2) return {4, 16, &pairs_avx2<4, 2>};
#endif
  return {4, 4, &pairs_scalar<4, 4>};
}

}  // namespace

void gemm_bf16(std::int64_t m, std::int64_t n, std::int64_t k, const Bf16Operand& a,
               const Bf16Operand& b, float* c, std::int64_t ldc, bool accumulate,
               const float* bias) {
  if (k == 0) {
    for (std::int64_t i = 0; i < m && !accumulate; ++i) {
      if (bias != nullptr) {
        std::copy_n(bias, n, c + i * ldc);
      } else {
        std::fill_n(c + i * ldc, n, 0.0f);
      }
    }
    return;
  }
  gemm_pairs(pair_shape(), m, n, k, a, b, c, ldc, Seed<float>{accumulate, bias});
}

}  // namespace detail

}  // namespace meshtensor::kernels
