#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define MESHTENSOR_X86_KERNELS 1
#endif

#include <fmt/format.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/core/half.hpp>
#include <meshtensor/core/profile.hpp>
#include <meshtensor/kernels/matmul.hpp>
#include <meshtensor/kernels/simd.hpp>

#include "matmul_bf16.hpp"
#include "matmul_tiles.hpp"

namespace meshtensor::kernels {

namespace {

/// Logical element (row, col) of an operand lives at data[row * row_stride + col * col_stride].
struct Operand {
  const std::byte* data = nullptr;
  DType dtype = DType::f32;
  std::int64_t row_stride = 0;
  std::int64_t col_stride = 0;
};

template <class T>
T to_compute(float value) {
  return static_cast<T>(value);
}
template <class T>
T to_compute(double value) {
  return static_cast<T>(value);
}
template <class T>
T to_compute(BFloat16 value) {
  return static_cast<T>(to_float(value));
}
template <class T>
T to_compute(Float16 value) {
  return static_cast<T>(to_float(value));
}

/// Copies op(x)[row0 + r][col0 + c] for r < rows, c < cols into out[c * ld + r], converting to T
/// and zero-filling up to `padded_rows` (packing of a panels: rows = mr, and of b strips, with the
/// roles of rows and columns swapped by the caller's strides).
template <class T, class S>
void pack_source(const Operand& x, std::int64_t row0, std::int64_t rows, std::int64_t padded_rows,
                 std::int64_t col0, std::int64_t cols, T* out, std::int64_t ld) {
  const S* base = reinterpret_cast<const S*>(x.data);
  if (x.row_stride == 1 && x.col_stride != 1) {
    // Transposed source: walk it along its contiguous dim.
    for (std::int64_t c = 0; c < cols; ++c) {
      const S* column = base + (col0 + c) * x.col_stride + row0;
      for (std::int64_t r = 0; r < rows; ++r)
        out[c * ld + r] = to_compute<T>(column[r]);
      for (std::int64_t r = rows; r < padded_rows; ++r)
        out[c * ld + r] = T{0};
    }
    return;
  }
  for (std::int64_t r = 0; r < rows; ++r) {
    const S* row = base + (row0 + r) * x.row_stride + col0 * x.col_stride;
    if (x.col_stride == 1) {
      for (std::int64_t c = 0; c < cols; ++c)
        out[c * ld + r] = to_compute<T>(row[c]);
    } else {
      for (std::int64_t c = 0; c < cols; ++c)
        out[c * ld + r] = to_compute<T>(row[c * x.col_stride]);
    }
  }
  for (std::int64_t r = rows; r < padded_rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c)
      out[c * ld + r] = T{0};
}

#if MESHTENSOR_X86_KERNELS
/// pack_source for f32 into f32 with AVX2: rows of a row-major source in 8 x 8 blocks
/// transposed in registers, columns of a transposed source copied 8 at a time. A copy: the
/// bits are the source's.
[[gnu::target("avx2")]] void pack_f32_avx2(const Operand& x, std::int64_t row0, std::int64_t rows,
                                           std::int64_t padded_rows, std::int64_t col0,
                                           std::int64_t cols, float* out, std::int64_t ld) {
  const auto* base = reinterpret_cast<const float*>(x.data);
  if (x.row_stride == 1 && x.col_stride != 1) {
    for (std::int64_t c = 0; c < cols; ++c) {
      const float* column = base + (col0 + c) * x.col_stride + row0;
      float* to = out + c * ld;
      std::int64_t r = 0;
      for (; r + 8 <= rows; r += 8)
        _mm256_storeu_ps(to + r, _mm256_loadu_ps(column + r));
      for (; r < rows; ++r)
        to[r] = column[r];
      for (; r < padded_rows; ++r)
        to[r] = 0.0f;
    }
    return;
  }
  const float* first = base + row0 * x.row_stride + col0;
  std::int64_t r = 0;
  for (; r + 8 <= rows; r += 8) {
    std::int64_t c = 0;
    for (; c + 8 <= cols; c += 8)
      transpose_8x8(first + r * x.row_stride + c, x.row_stride, out + c * ld + r, ld);
    for (; c < cols; ++c)
      for (std::int64_t i = r; i < r + 8; ++i)
        out[c * ld + i] = first[i * x.row_stride + c];
  }
  for (; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c)
      out[c * ld + r] = first[r * x.row_stride + c];
  for (; r < padded_rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c)
      out[c * ld + r] = 0.0f;
}
#endif

template <class T>
void pack(const Operand& x, std::int64_t row0, std::int64_t rows, std::int64_t padded_rows,
          std::int64_t col0, std::int64_t cols, T* out, std::int64_t ld) {
#if MESHTENSOR_X86_KERNELS
  if constexpr (std::is_same_v<T, float>) {
    if (x.dtype == DType::f32 && (x.col_stride == 1 || x.row_stride == 1) &&
        simd_level() != SimdLevel::baseline)
      return pack_f32_avx2(x, row0, rows, padded_rows, col0, cols, out, ld);
  }
#endif
  switch (x.dtype) {
    case DType::f64:
      return pack_source<T, double>(x, row0, rows, padded_rows, col0, cols, out, ld);
    case DType::bf16:
      return pack_source<T, BFloat16>(x, row0, rows, padded_rows, col0, cols, out, ld);
    case DType::f16:
      return pack_source<T, Float16>(x, row0, rows, padded_rows, col0, cols, out, ld);
    default:
      return pack_source<T, float>(x, row0, rows, padded_rows, col0, cols, out, ld);
  }
}

/// Copies `take` floats to `to` and zero-fills it to `width`: a panel's slice of one line of a
/// transposed source. The tile widths are copied with a size the compiler knows, inline, where a
/// call to memmove for a few dozen bytes had cost more than the copy.
inline void copy_short(const float* from, std::int64_t take, std::int64_t width, float* to) {
  if (take == 8 && width == 8) {
    std::memcpy(to, from, 8 * sizeof(float));
  } else if (take == 12 && width == 12) {
    std::memcpy(to, from, 12 * sizeof(float));
  } else {
    std::copy_n(from, take, to);
    std::fill(to + take, to + width, 0.0f);
  }
}

/// Packs rows [row0, row0 + rows) of op(x) as consecutive panels of `width` rows (the last
/// zero-padded), panel p at out + p·cols·width laid out as pack() lays one. A transposed f32
/// source is walked once along its contiguous dim for all panels, so each cache line it reads
/// serves every panel at once rather than one panel's share of it per pass.
template <class T>
void pack_panels(const Operand& x, std::int64_t row0, std::int64_t rows, std::int64_t width,
                 std::int64_t col0, std::int64_t cols, T* out) {
  const std::int64_t panels = (rows + width - 1) / width;
  if constexpr (std::is_same_v<T, float>) {
    if (x.dtype == DType::f32 && x.row_stride == 1 && x.col_stride != 1 && panels > 1) {
      const auto* base = reinterpret_cast<const float*>(x.data);
      for (std::int64_t c = 0; c < cols; ++c) {
        const float* line = base + (col0 + c) * x.col_stride + row0;
        for (std::int64_t p = 0; p < panels; ++p) {
          const std::int64_t take = std::min(width, rows - p * width);
          float* to = out + p * cols * width + c * width;
          copy_short(line + p * width, take, width, to);
        }
      }
      return;
    }
  }
  for (std::int64_t p = 0; p < panels; ++p) {
    const std::int64_t first = row0 + p * width;
    pack<T>(x, first, std::min(width, row0 + rows - first), width, col0, cols,
            out + p * cols * width, width);
  }
}

/// The transpose of an operand: element (r, c) of the result is (c, r) of x.
Operand transposed(Operand x) {
  std::swap(x.row_stride, x.col_stride);
  return x;
}

/// Runs kc multiply-add steps on one mr x nr tile: c[r][j] = fma(a[k][r], b[k][j], c[r][j]) for
/// k ascending. `a` is a packed panel [kc][mr] (lda unused), or for the direct kernels mr rows
/// of a read in place (row r at a + r * lda); row k of `b` starts at b + k * ldb (a packed strip
/// [kc][nr] has ldb = nr; b read in place has its row stride); `c` is the tile with row stride
/// ldc. The chains start from `init` (row r at init + r * ld_init: c itself, or with ld_init 0 one
/// row for all, a bias), or from +0 where it is null. Every element is the same fma chain whatever
/// the layout, so packed and in-place reads give the same bits.
template <class T>
using MicroKernel = void (*)(std::int64_t kc, const T* a, std::int64_t lda, const T* b,
                             std::int64_t ldb, T* c, std::int64_t ldc, const T* init,
                             std::int64_t ld_init);

/// Most rows a tile has at any SIMD level.
constexpr int kMaxTileRows = 12;

template <class T>
struct KernelShape {
  int mr;
  int nr;
  MicroKernel<T> run;
  /// The same tile reading a in place (null where there is none): one-strip outputs, where
  /// packing a would cost as much as the multiply-adds. (Wider outputs gain nothing from it:
  /// the same speed at the GPTs' shapes on Intel, within the runs' noise.)
  MicroKernel<T> run_direct = nullptr;
  /// direct_rows[r]: the tile of r <= mr rows (nr columns) reading a in place, for the rows of
  /// a short product (a decode step's few rows), which would otherwise be padded to mr rows of
  /// multiply-adds; null where there is none.
  MicroKernel<T> direct_rows[kMaxTileRows + 1] = {};
  /// wide_rows[r]: the same for a tile of wide_columns[r] >= nr columns: a row's fma chains are
  /// sequential, so few rows need more columns side by side to keep the FMA units busy.
  MicroKernel<T> wide_rows[kMaxTileRows + 1] = {};
  int wide_columns[kMaxTileRows + 1] = {};
};

template <class T, int MR, int NR>
void micro_scalar(std::int64_t kc, const T* a, std::int64_t /*lda*/, const T* b, std::int64_t ldb,
                  T* c, std::int64_t ldc, const T* init, std::int64_t ld_init) {
  T acc[MR][NR];
  for (int r = 0; r < MR; ++r)
    for (int j = 0; j < NR; ++j)
      acc[r][j] = init != nullptr ? init[r * ld_init + j] : T{0};
  for (std::int64_t k = 0; k < kc; ++k, a += MR, b += ldb)
    for (int r = 0; r < MR; ++r)
      for (int j = 0; j < NR; ++j)
        acc[r][j] = std::fma(a[r], b[j], acc[r][j]);
  for (int r = 0; r < MR; ++r)
    for (int j = 0; j < NR; ++j)
      c[r * ldc + j] = acc[r][j];
}

#if MESHTENSOR_X86_KERNELS
#define MESHTENSOR_AVX512 gnu::target("avx512f,fma"), gnu::always_inline
#define MESHTENSOR_AVX2 gnu::target("avx2,fma"), gnu::always_inline

// Thin overloads so that one kernel template serves f32 and f64 at each width.
[[MESHTENSOR_AVX512]] inline __m512 vload(const float* p, __m512) {
  return _mm512_loadu_ps(p);
}
[[MESHTENSOR_AVX512]] inline __m512d vload(const double* p, __m512d) {
  return _mm512_loadu_pd(p);
}
[[MESHTENSOR_AVX512]] inline void vstore(float* p, __m512 v) {
  _mm512_storeu_ps(p, v);
}
[[MESHTENSOR_AVX512]] inline void vstore(double* p, __m512d v) {
  _mm512_storeu_pd(p, v);
}
[[MESHTENSOR_AVX512]] inline __m512 vbroadcast(float x, __m512) {
  return _mm512_set1_ps(x);
}
[[MESHTENSOR_AVX512]] inline __m512d vbroadcast(double x, __m512d) {
  return _mm512_set1_pd(x);
}
[[MESHTENSOR_AVX512]] inline __m512 vzero(__m512) {
  return _mm512_setzero_ps();
}
[[MESHTENSOR_AVX512]] inline __m512d vzero(__m512d) {
  return _mm512_setzero_pd();
}
[[MESHTENSOR_AVX512]] inline __m512 vfma(__m512 a, __m512 b, __m512 c) {
  return _mm512_fmadd_ps(a, b, c);
}
[[MESHTENSOR_AVX512]] inline __m512d vfma(__m512d a, __m512d b, __m512d c) {
  return _mm512_fmadd_pd(a, b, c);
}
[[MESHTENSOR_AVX2]] inline __m256 vload(const float* p, __m256) {
  return _mm256_loadu_ps(p);
}
[[MESHTENSOR_AVX2]] inline __m256d vload(const double* p, __m256d) {
  return _mm256_loadu_pd(p);
}
[[MESHTENSOR_AVX2]] inline void vstore(float* p, __m256 v) {
  _mm256_storeu_ps(p, v);
}
[[MESHTENSOR_AVX2]] inline void vstore(double* p, __m256d v) {
  _mm256_storeu_pd(p, v);
}
[[MESHTENSOR_AVX2]] inline __m256 vbroadcast(float x, __m256) {
  return _mm256_set1_ps(x);
}
[[MESHTENSOR_AVX2]] inline __m256d vbroadcast(double x, __m256d) {
  return _mm256_set1_pd(x);
}
[[MESHTENSOR_AVX2]] inline __m256 vzero(__m256) {
  return _mm256_setzero_ps();
}
[[MESHTENSOR_AVX2]] inline __m256d vzero(__m256d) {
  return _mm256_setzero_pd();
}
[[MESHTENSOR_AVX2]] inline __m256 vfma(__m256 a, __m256 b, __m256 c) {
  return _mm256_fmadd_ps(a, b, c);
}
[[MESHTENSOR_AVX2]] inline __m256d vfma(__m256d a, __m256d b, __m256d c) {
  return _mm256_fmadd_pd(a, b, c);
}

// The tile is MR rows by two vectors; the accumulators stay in registers for the whole k loop.
// Vector types by width and element, as member types (attributes are lost on template args).
template <class T>
struct Vector512;
template <>
struct Vector512<float> {
  using type = __m512;
};
template <>
struct Vector512<double> {
  using type = __m512d;
};
template <class T>
struct Vector256;
template <>
struct Vector256<float> {
  using type = __m256;
};
template <>
struct Vector256<double> {
  using type = __m256d;
};

// The tile is MR rows by NV vectors; the accumulators stay in registers for the whole k loop.
#define MESHTENSOR_MICRO_KERNEL(name, attribute, vector)                                        \
  template <class T, int MR, int NV, bool kDirectA = false>                                     \
  [[attribute]] void name(std::int64_t kc, const T* a, std::int64_t lda, const T* b,            \
                          std::int64_t ldb, T* c, std::int64_t ldc, const T* init,              \
                          std::int64_t ld_init) {                                               \
    using V = typename vector<T>::type;                                                         \
    constexpr int kLanes = static_cast<int>(sizeof(V) / sizeof(T));                             \
    const std::int64_t a_row = kDirectA ? lda : 1;                                              \
    const std::int64_t a_step = kDirectA ? 1 : MR;                                              \
    const V tag{};                                                                              \
    V acc[MR][NV];                                                                              \
    _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) {                                     \
      _Pragma("GCC unroll 8") for (int v = 0; v < NV; ++v) {                                    \
        acc[r][v] = init != nullptr ? vload(init + r * ld_init + v * kLanes, tag) : vzero(tag); \
      }                                                                                         \
    }                                                                                           \
    for (std::int64_t k = 0; k < kc; ++k, a += a_step, b += ldb) {                              \
      V bv[NV];                                                                                 \
      _Pragma("GCC unroll 8") for (int v = 0; v < NV; ++v) bv[v] = vload(b + v * kLanes, tag);  \
      _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) {                                   \
        const V ar = vbroadcast(a[r * a_row], tag);                                             \
        _Pragma("GCC unroll 8") for (int v = 0; v < NV; ++v) {                                  \
          acc[r][v] = vfma(ar, bv[v], acc[r][v]);                                               \
        }                                                                                       \
      }                                                                                         \
    }                                                                                           \
    _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) {                                     \
      _Pragma("GCC unroll 8") for (int v = 0; v < NV; ++v) {                                    \
        vstore(c + r * ldc + v * kLanes, acc[r][v]);                                            \
      }                                                                                         \
    }                                                                                           \
  }

MESHTENSOR_MICRO_KERNEL(micro_avx512, gnu::target("avx512f,fma"), Vector512)
MESHTENSOR_MICRO_KERNEL(micro_avx2, gnu::target("avx2,fma"), Vector256)
#undef MESHTENSOR_MICRO_KERNEL

bool cpu_has_fma() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("fma");
}
#endif

#if MESHTENSOR_X86_KERNELS
/// Vectors side by side in a wide in-place tile of `rows` rows: as many accumulators as the
/// registers hold beside one row of b and a broadcast (32 registers with AVX-512, 16 with AVX2).
constexpr int wide_vectors(int rows, int registers) {
  for (int nv = 8; nv > 2; --nv)
    if (rows * nv + nv + 1 <= registers) return nv;
  return 2;
}

/// A tile shape with its in-place kernels of 1 to MR rows.
template <class T, int MR, int NV, class Kernels>
KernelShape<T> shape_with_rows(int lanes) {
  KernelShape<T> shape{MR, NV * lanes, Kernels::template run<MR, NV, false>,
                       NV == 1 ? Kernels::template run<MR, NV, true> : nullptr};
  [&]<int... R>(std::integer_sequence<int, R...>) {
    ((shape.direct_rows[R + 1] = Kernels::template run<R + 1, NV, true>), ...);
    if constexpr (NV == 2) {
      ((shape.wide_rows[R + 1] =
            Kernels::template run<R + 1, wide_vectors(R + 1, Kernels::kRegisters), true>),
       ...);
      ((shape.wide_columns[R + 1] = wide_vectors(R + 1, Kernels::kRegisters) * lanes), ...);
    }
  }
  (std::make_integer_sequence<int, MR>{});
  return shape;
}

struct Avx512Kernels {
  static constexpr int kRegisters = 32;
  template <class T, int MR, int NV, bool kDirectA>
  static constexpr MicroKernel<T> kernel = &micro_avx512<T, MR, NV, kDirectA>;
};
struct Avx2Kernels {
  static constexpr int kRegisters = 16;
  template <class T, int MR, int NV, bool kDirectA>
  static constexpr MicroKernel<T> kernel = &micro_avx2<T, MR, NV, kDirectA>;
};
/// The kernels of one level for one element type.
template <class T, class Level>
struct Kernels {
  static constexpr int kRegisters = Level::kRegisters;
  template <int MR, int NV, bool kDirectA>
  static constexpr MicroKernel<T> run = Level::template kernel<T, MR, NV, kDirectA>;
};
#endif

/// The tile shape for this SIMD level; outputs at most one vector wide get a one-vector tile
/// with more rows.
template <class T>
KernelShape<T> kernel_for_level(std::int64_t n) {
#if MESHTENSOR_X86_KERNELS
  const SimdLevel level = simd_level();
  if (level == SimdLevel::avx512) {
    constexpr int kLanes = static_cast<int>(64 / sizeof(T));
    static const KernelShape<T> narrow =
        shape_with_rows<T, 12, 1, Kernels<T, Avx512Kernels>>(kLanes);
    static const KernelShape<T> wide = shape_with_rows<T, 8, 2, Kernels<T, Avx512Kernels>>(kLanes);
    return n <= kLanes ? narrow : wide;
  }
  static const bool has_fma = cpu_has_fma();
  if (level == SimdLevel::avx2 && has_fma) {
    constexpr int kLanes = static_cast<int>(32 / sizeof(T));
    static const KernelShape<T> narrow = shape_with_rows<T, 8, 1, Kernels<T, Avx2Kernels>>(kLanes);
    static const KernelShape<T> wide = shape_with_rows<T, 6, 2, Kernels<T, Avx2Kernels>>(kLanes);
    return n <= kLanes ? narrow : wide;
  }
#endif
  (void)n;
  return {4, 4, &micro_scalar<T, 4, 4>, nullptr};
}

std::int64_t round_up(std::int64_t value, std::int64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

/// Products with at most this many rows read both operands in place (when they are row-major
/// of the compute type): a decode step's few rows would otherwise pay for packing all of b, a
/// copy of the whole weight, on every call, and for tiles padded to mr rows.
constexpr std::int64_t kInPlaceRows = 16;

/// c = a·b (+ c) for a short a, reading a and b in place: rows in groups of at most mr with the
/// kernel of that many rows, columns in strips of nr read straight from b, the last partial
/// strip from a zero-padded copy. The same fma chains as gemm(), so the same bits.
template <class T>
void gemm_in_place(const KernelShape<T>& kernel, std::int64_t m, std::int64_t n, std::int64_t k,
                   const T* a, std::int64_t lda, const T* b, std::int64_t ldb, T* c,
                   std::int64_t ldc, Seed<T> seed) {
  const std::int64_t nr = kernel.nr;
  thread_local std::vector<T> strip;
  thread_local std::vector<T> edge;
  for (std::int64_t row0 = 0; row0 < m; row0 += kernel.mr) {
    const std::int64_t rows = std::min<std::int64_t>(kernel.mr, m - row0);
    const T* a_rows = a + row0 * lda;
    T* c_rows = c + row0 * ldc;
    // Wide strips, then nr-wide strips, all read from b in place; then the last partial strip.
    std::int64_t col0 = 0;
    if (kernel.wide_rows[rows] != nullptr) {
      const std::int64_t width = kernel.wide_columns[rows];
      for (; col0 + width <= n; col0 += width) {
        const auto init = seed.at(c, ldc, row0, col0);
        kernel.wide_rows[rows](k, a_rows, lda, b + col0, ldb, c_rows + col0, ldc, init.first,
                               init.second);
      }
    }
    const MicroKernel<T> run = kernel.direct_rows[rows];
    for (; col0 + nr <= n; col0 += nr) {
      const auto init = seed.at(c, ldc, row0, col0);
      run(k, a_rows, lda, b + col0, ldb, c_rows + col0, ldc, init.first, init.second);
    }
    if (col0 == n) continue;
    const std::int64_t cols = n - col0;
    strip.assign(static_cast<std::size_t>(k * nr), T{0});
    for (std::int64_t kk = 0; kk < k; ++kk)
      std::copy_n(b + kk * ldb + col0, cols, strip.data() + kk * nr);
    edge.resize(static_cast<std::size_t>(rows * nr));
    run_on_edge(
        [&](T* out, const T* init) { run(k, a_rows, lda, strip.data(), nr, out, nr, init, nr); },
        edge, nr, rows, cols, c_rows + col0, ldc, seed.at(c, ldc, row0, col0));
  }
}

#if MESHTENSOR_X86_KERNELS
// GCC 12 takes the _mm512_undefined_ps() inside the shuffle intrinsics for uninitialised reads.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
/// Transposes the 16 x 16 block `r` (r[i] holds row i) in place: r[c] then holds column c.
[[gnu::target("avx512f"), gnu::always_inline]] inline void transpose_16x16(__m512 (&r)[16]) {
  __m512 t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  // u[4i + q], 128-bit lane l: element 4l + q of rows 4i .. 4i + 3.
  __m512 u[16];
  for (int i = 0; i < 4; ++i) {
    u[4 * i] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
    u[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
    u[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
    u[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
  }
  for (int q = 0; q < 4; ++q) {
    const __m512 v0 = _mm512_shuffle_f32x4(u[q], u[4 + q], 0x88);
    const __m512 v1 = _mm512_shuffle_f32x4(u[q], u[4 + q], 0xDD);
    const __m512 v2 = _mm512_shuffle_f32x4(u[8 + q], u[12 + q], 0x88);
    const __m512 v3 = _mm512_shuffle_f32x4(u[8 + q], u[12 + q], 0xDD);
    r[q] = _mm512_shuffle_f32x4(v0, v2, 0x88);
    r[4 + q] = _mm512_shuffle_f32x4(v1, v3, 0x88);
    r[8 + q] = _mm512_shuffle_f32x4(v0, v2, 0xDD);
    r[12 + q] = _mm512_shuffle_f32x4(v1, v3, 0xDD);
  }
}

/// R rows of c, the 16 columns from `col0`, for a b stored transposed (op(b)[k][j] at
/// b[k + j·ldb], a tied head's table): each 16 x 16 block of the table is loaded row by row and
/// transposed in registers, so b is read in place, never packed. Columns at or past n are
/// masked. The chains are gemm()'s: one fma per k in ascending order from the seed. (Two or
/// four blocks side by side spill the transposed blocks: measured slower on Zen 5.)
template <int R>
[[gnu::target("avx512f,fma")]] void transposed_b_rows(std::int64_t n, std::int64_t k,
                                                      const float* a, std::int64_t lda,
                                                      const float* b, std::int64_t ldb, float* c,
                                                      std::int64_t ldc, std::int64_t col0,
                                                      std::pair<const float*, std::int64_t> init) {
  const std::int64_t valid = std::min<std::int64_t>(n - col0, 16);
  const auto columns = static_cast<__mmask16>((1U << valid) - 1U);
  __m512 acc[R];
  for (int r = 0; r < R; ++r) {
    acc[r] = init.first == nullptr
                 ? _mm512_setzero_ps()
                 : _mm512_maskz_loadu_ps(columns, init.first + r * init.second + col0);
  }
  for (std::int64_t k0 = 0; k0 < k; k0 += 16) {
    const std::int64_t depth = std::min<std::int64_t>(k - k0, 16);
    const auto loaded = static_cast<__mmask16>((1U << depth) - 1U);
    // Measured: asking for the 16 rows' lines first keeps them in flight together (23.7 ms
    // against 31.4 for a Qwen3 head row on Zen 5; the masked loads alone wait more).
    for (std::int64_t j = 0; j < valid; ++j)
      _mm_prefetch(reinterpret_cast<const char*>(b + (col0 + j) * ldb + k0), _MM_HINT_T0);
    __m512 block[16];
    for (std::int64_t j = 0; j < 16; ++j) {
      block[j] = j < valid ? _mm512_maskz_loadu_ps(loaded, b + (col0 + j) * ldb + k0)
                           : _mm512_setzero_ps();
    }
    transpose_16x16(block);
    for (std::int64_t kk = 0; kk < depth; ++kk) {
      for (int r = 0; r < R; ++r)
        acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(a[r * lda + k0 + kk]), block[kk], acc[r]);
    }
  }
  for (int r = 0; r < R; ++r)
    _mm512_mask_storeu_ps(c + r * ldc + col0, columns, acc[r]);
}

/// c = a·op(b) (+ c) for at most kInPlaceRows rows of a row-major f32 `a` and a b stored
/// transposed (a tied head's table, op(b)[k][j] at b[k + j·ldb]): decode's product with the
/// vocabulary, which would otherwise pack (transpose) the whole table on every call.
[[gnu::target("avx512f,fma")]] void gemm_transposed_b(std::int64_t m, std::int64_t n,
                                                      std::int64_t k, const float* a,
                                                      std::int64_t lda, const float* b,
                                                      std::int64_t ldb, float* c, std::int64_t ldc,
                                                      Seed<float> seed) {
  for (std::int64_t row0 = 0; row0 < m; row0 += 4) {
    const std::int64_t rows = std::min<std::int64_t>(4, m - row0);
    const auto init = seed.at(c, ldc, row0, 0);
    const float* a_rows = a + row0 * lda;
    float* c_rows = c + row0 * ldc;
    for (std::int64_t col0 = 0; col0 < n; col0 += 16) {
      switch (rows) {
        case 1:
          transposed_b_rows<1>(n, k, a_rows, lda, b, ldb, c_rows, ldc, col0, init);
          break;
        case 2:
          transposed_b_rows<2>(n, k, a_rows, lda, b, ldb, c_rows, ldc, col0, init);
          break;
        case 3:
          transposed_b_rows<3>(n, k, a_rows, lda, b, ldb, c_rows, ldc, col0, init);
          break;
        default:
          transposed_b_rows<4>(n, k, a_rows, lda, b, ldb, c_rows, ldc, col0, init);
          break;
      }
    }
  }
}
#pragma GCC diagnostic pop
#endif

// Blocking: a kc x nc block of b stays in L2; each kc x nr strip of it stays in L1 while every
// kc x mr panel of a's block (from L2) meets it, as BLIS orders its loops. Any blocking and any
// order of the tiles give the same bits.
template <class T>
void gemm(const KernelShape<T>& kernel, std::int64_t m, std::int64_t n, std::int64_t k,
          const Operand& a, const Operand& b, T* c, std::int64_t ldc, Seed<T> seed) {
  constexpr std::int64_t kBlockK = 256;
  const std::int64_t block_n = sizeof(T) == 4 ? 1024 : 512;
  const std::int64_t mr = kernel.mr;
  const std::int64_t nr = kernel.nr;
  const std::int64_t block_m = mr * (96 / mr);
  if (k == 0) {
    for (std::int64_t i = 0; i < m && !seed.accumulate; ++i) {
      if (seed.bias != nullptr) {
        std::copy_n(seed.bias, n, c + i * ldc);
      } else {
        std::fill_n(c + i * ldc, n, T{0});
      }
    }
    return;
  }
  const DType compute = sizeof(T) == 4 ? DType::f32 : DType::f64;
#if MESHTENSOR_X86_KERNELS
  if constexpr (std::is_same_v<T, float>) {
    if (m <= kInPlaceRows && simd_level() == SimdLevel::avx512 && a.col_stride == 1 &&
        a.dtype == DType::f32 && b.row_stride == 1 && b.col_stride != 1 && b.dtype == DType::f32) {
      return gemm_transposed_b(m, n, k, reinterpret_cast<const float*>(a.data), a.row_stride,
                               reinterpret_cast<const float*>(b.data), b.col_stride, c, ldc, seed);
    }
  }
#endif
  if (m <= kInPlaceRows && kernel.direct_rows[1] != nullptr && a.col_stride == 1 &&
      a.dtype == compute && b.col_stride == 1 && b.dtype == compute) {
    return gemm_in_place(kernel, m, n, k, reinterpret_cast<const T*>(a.data), a.row_stride,
                         reinterpret_cast<const T*>(b.data), b.row_stride, c, ldc, seed);
  }
  const T* direct_a =
      kernel.run_direct != nullptr && n <= nr && a.col_stride == 1 && a.dtype == compute
          ? reinterpret_cast<const T*>(a.data)
          : nullptr;
  thread_local std::vector<T> packed_a;
  thread_local std::vector<T> packed_b;
  thread_local std::vector<T> edge;
  packed_a.resize(static_cast<std::size_t>(kBlockK * block_m));
  packed_b.resize(static_cast<std::size_t>(kBlockK * round_up(block_n, nr)));
  edge.resize(static_cast<std::size_t>(mr * nr));

  for (std::int64_t pc = 0; pc < k; pc += kBlockK) {
    const std::int64_t kc = std::min(kBlockK, k - pc);
    // Past the first block of k every chain goes on from c.
    const Seed<T> start = pc == 0 ? seed : Seed<T>{true, nullptr};
    for (std::int64_t jc = 0; jc < n; jc += block_n) {
      const std::int64_t nc = std::min(block_n, n - jc);
      const std::int64_t strips = (nc + nr - 1) / nr;
      pack_panels<T>(transposed(b), jc, nc, nr, pc, kc, packed_b.data());
      for (std::int64_t ic = 0; ic < m; ic += block_m) {
        const std::int64_t mc = std::min(block_m, m - ic);
        const std::int64_t panels = (mc + mr - 1) / mr;
        // A full panel of a row-major `a` of the compute type can be read in place.
        const auto direct = [&](std::int64_t row0) {
          return direct_a != nullptr && row0 + mr <= m;
        };
        if (direct_a == nullptr) {
          pack_panels<T>(a, ic, mc, mr, pc, kc, packed_a.data());
        } else {
          for (std::int64_t p = 0; p < panels; ++p) {
            const std::int64_t row0 = ic + p * mr;
            if (direct(row0)) continue;
            pack<T>(a, row0, std::min(mr, m - row0), mr, pc, kc, packed_a.data() + p * kc * mr, mr);
          }
        }
        for (std::int64_t s = 0; s < strips; ++s) {
          const std::int64_t col0 = jc + s * nr;
          const std::int64_t cols = std::min(nr, n - col0);
          const T* strip = packed_b.data() + s * kc * nr;
          for (std::int64_t p = 0; p < panels; ++p) {
            const std::int64_t row0 = ic + p * mr;
            const std::int64_t rows = std::min(mr, m - row0);
            const bool in_place = direct(row0);
            const MicroKernel<T> run = in_place ? kernel.run_direct : kernel.run;
            const T* panel =
                in_place ? direct_a + row0 * a.row_stride + pc : packed_a.data() + p * kc * mr;
            T* tile = c + row0 * ldc + col0;
            const auto init = start.at(c, ldc, row0, col0);
            if (rows == mr && cols == nr) {
              run(kc, panel, a.row_stride, strip, nr, tile, ldc, init.first, init.second);
              continue;
            }
            run_on_edge(
                [&](T* out, const T* from) {
                  run(kc, panel, a.row_stride, strip, nr, out, nr, from, nr);
                },
                edge, nr, rows, cols, tile, ldc, init);
          }
        }
      }
    }
  }
}

Operand operand_of(const Tensor& t, Transpose transpose) {
  const auto& strides = t.strides();
  const std::int64_t row_stride = strides[0];
  const std::int64_t col_stride = strides[1];
  Operand operand{t.bytes().data(), t.dtype(), row_stride, col_stride};
  if (transpose == Transpose::yes) std::swap(operand.row_stride, operand.col_stride);
  return operand;
}

bool is_matmul_input(DType dtype) {
  return dtype == DType::f32 || dtype == DType::f64 || dtype == DType::bf16 || dtype == DType::f16;
}

/// Checks the operands of c = op(a)·op(b) and runs it, each chain starting from c (accumulate),
/// from bias[j] (a defined bias) or from +0.
void checked_matmul(const Tensor& a, Transpose transpose_a, const Tensor& b, Transpose transpose_b,
                    Tensor& c, bool accumulate, const Tensor& bias) {
  const ProfileScope profile(ProfileRow::matmul);
  if (!a.defined() || !b.defined() || !c.defined())
    throw InvalidArgument("matmul: an operand is undefined");
  if (a.rank() != 2 || b.rank() != 2 || c.rank() != 2) {
    throw InvalidArgument(fmt::format("matmul needs 2-D operands, got shapes {}, {} and {}",
                                      a.shape().to_string(), b.shape().to_string(),
                                      c.shape().to_string()));
  }
  if (a.dtype() != b.dtype() || !is_matmul_input(a.dtype())) {
    throw InvalidArgument(
        fmt::format("matmul needs two f32, f64, bf16 or f16 inputs of one dtype, "
                    "got {} and {}",
                    dtype_name(a.dtype()), dtype_name(b.dtype())));
  }
  const DType out = a.dtype() == DType::f64 ? DType::f64 : DType::f32;
  if (c.dtype() != out) {
    throw InvalidArgument(fmt::format("matmul of {} inputs writes {}, got a {} output",
                                      dtype_name(a.dtype()), dtype_name(out),
                                      dtype_name(c.dtype())));
  }
  const bool ta = transpose_a == Transpose::yes;
  const bool tb = transpose_b == Transpose::yes;
  const std::int64_t m = a.shape()[ta ? 1 : 0];
  const std::int64_t k = a.shape()[ta ? 0 : 1];
  const std::int64_t kb = b.shape()[tb ? 1 : 0];
  const std::int64_t n = b.shape()[tb ? 0 : 1];
  if (k != kb || c.shape()[0] != m || c.shape()[1] != n) {
    throw InvalidArgument(fmt::format("matmul shapes do not fit: op(a) is {}x{}, op(b) {}x{}, c {}",
                                      m, k, kb, n, c.shape().to_string()));
  }
  if (bias.defined() &&
      (bias.dtype() != out || bias.rank() != 1 || bias.shape()[0] != n || !bias.is_contiguous())) {
    throw InvalidArgument(
        fmt::format("matmul_bias: the bias must be a contiguous {} [{}], got {} {}",
                    dtype_name(out), n, dtype_name(bias.dtype()), bias.shape().to_string()));
  }
  if (m == 0 || n == 0) return;
  if (a.dtype() == DType::bf16) {
    const auto bits = [](const Tensor& t, Transpose transpose) {
      const Operand x = operand_of(t, transpose);
      return detail::Bf16Operand{reinterpret_cast<const std::uint16_t*>(x.data), x.row_stride,
                                 x.col_stride};
    };
    detail::gemm_bf16(
        m, n, k, bits(a, transpose_a), bits(b, transpose_b),
        reinterpret_cast<float*>(c.bytes().data()), n, accumulate,
        bias.defined() ? reinterpret_cast<const float*>(bias.bytes().data()) : nullptr);
    return;
  }
  const Operand lhs = operand_of(a, transpose_a);
  const Operand rhs = operand_of(b, transpose_b);
  const std::int64_t ldc = n;
  const auto run = [&]<class T>(T* to) {
    const T* first = bias.defined() ? reinterpret_cast<const T*>(bias.bytes().data()) : nullptr;
    gemm<T>(kernel_for_level<T>(n), m, n, k, lhs, rhs, to, ldc, Seed<T>{accumulate, first});
  };
  if (out == DType::f64) {
    run(reinterpret_cast<double*>(c.bytes().data()));
  } else {
    run(reinterpret_cast<float*>(c.bytes().data()));
  }
}

}  // namespace

void matmul(const Tensor& a, Transpose transpose_a, const Tensor& b, Transpose transpose_b,
            Tensor c, bool accumulate) {
  checked_matmul(a, transpose_a, b, transpose_b, c, accumulate, Tensor());
}

void matmul_bias(const Tensor& a, Transpose transpose_a, const Tensor& b, Transpose transpose_b,
                 const Tensor& bias, Tensor c) {
  if (!bias.defined()) throw InvalidArgument("matmul_bias: the bias is undefined");
  checked_matmul(a, transpose_a, b, transpose_b, c, false, bias);
}

}  // namespace meshtensor::kernels
