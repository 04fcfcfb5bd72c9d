#pragma once

// f32 vectors of W lanes (GCC vector extensions) and the register-tiled products of chains that
// the attention kernels are made of (internal header). Every element is one chain of separate
// multiplies and adds (never fused, never reassociated), so any lane width and any tile shape
// give the bits of the plain scalar loop; only the speed changes.
#include <algorithm>
#include <cstdint>
#include <cstring>

#if defined(__GNUC__) && !defined(__clang__)
// The vector types never cross a non-inlined call, so the ABI note does not apply.
#pragma GCC diagnostic ignored "-Wpsabi"
#endif

namespace meshtensor::kernels::lanes {

template <int W>
struct VectorOf {
  typedef float type __attribute__((vector_size(4 * W)));
  typedef std::int32_t index __attribute__((vector_size(4 * W)));
};
/// W f32 lanes; W = 1 is a scalar in vector clothing, for tails.
template <int W>
using Vec = typename VectorOf<W>::type;

template <int W>
[[gnu::always_inline]] inline Vec<W> load(const float* p) {
  Vec<W> v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

template <int W>
[[gnu::always_inline]] inline void store(float* p, Vec<W> v) {
  std::memcpy(p, &v, sizeof v);
}

/// s in every lane: lane 0 shuffled everywhere, which compiles to one broadcast.
template <int W>
[[gnu::always_inline]] inline Vec<W> splat(float s) {
  Vec<W> v{};
  v[0] = s;
  return __builtin_shuffle(v, typename VectorOf<W>::index{});
}

/// Accumulator vectors a tile keeps in registers at lane width W (32 vector registers with
/// AVX-512, 16 below).
template <int W>
inline constexpr int kAccumulators = W >= 16 ? 16 : 8;

// ---- The register tile both products are made of ----------------------------------------------

/// acc[r][v] = acc[r][v] + scalar(r, k) · row(k)[v·W ..] for k in [lo, hi) ascending, with R
/// rows by NV vectors of accumulators held in registers.
template <int W, int R, int NV, class Scalar, class Row>
[[gnu::always_inline]] inline void accumulate_tile(Vec<W> (&acc)[R][NV], std::int64_t lo,
                                                   std::int64_t hi, Scalar scalar, Row row) {
  for (std::int64_t k = lo; k < hi; ++k) {
    const float* vectors = row(k);
    Vec<W> xv[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v)
      xv[v] = load<W>(vectors + v * W);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      // A scalar operand, not a splat vector: GCC broadcasts it straight from memory, where
      // splat's shuffle took an FP pipe per row and step (the products ran 1.5x slower).
      const float s = scalar(r, k);
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v)
        acc[r][v] = acc[r][v] + s * xv[v];
    }
  }
}

/// acc[r][v] read from (load) or written to out + r·ldo + v·W.
template <int W, int R, int NV, bool kLoad>
[[gnu::always_inline]] inline void move_tile(Vec<W> (&acc)[R][NV], float* out, std::int64_t ldo) {
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) {
      if constexpr (kLoad) {
        acc[r][v] = load<W>(out + r * ldo + v * W);
      } else {
        store<W>(out + r * ldo + v * W, acc[r][v]);
      }
    }
  }
}

// ---- Products over a depth: out[r][j] = Σ_d a[r][d] · bt[d][j] --------------------------------

/// R rows by NV vectors of columns: each out element starts at +0 and adds a[r·lda + d] ·
/// bt[d·ldb + j] for d ascending.
template <int W, int R, int NV>
[[gnu::always_inline]] inline void dot_tile(const float* a, std::int64_t lda, const float* bt,
                                            std::int64_t ldb, std::int64_t depth, float* out,
                                            std::int64_t ldo) {
  Vec<W> acc[R][NV];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v)
      acc[r][v] = splat<W>(0.0f);
  accumulate_tile<W, R, NV>(
      acc, 0, depth, [=](int r, std::int64_t d) { return a[r * lda + d]; },
      [=](std::int64_t d) { return bt + d * ldb; });
  move_tile<W, R, NV, false>(acc, out, ldo);
}

/// dot_tile over columns [0, width) of R rows: wide tiles, then single vectors, then narrower
/// lanes for the last columns.
template <int W, int R>
[[gnu::always_inline]] inline void dot_columns(const float* a, std::int64_t lda, const float* bt,
                                               std::int64_t ldb, std::int64_t depth,
                                               std::int64_t width, float* out, std::int64_t ldo) {
  constexpr int kWide = W >= 16 ? 4 : 2;
  std::int64_t j = 0;
  for (; j + kWide * W <= width; j += kWide * W)
    dot_tile<W, R, kWide>(a, lda, bt + j, ldb, depth, out + j, ldo);
  for (; j + W <= width; j += W)
    dot_tile<W, R, 1>(a, lda, bt + j, ldb, depth, out + j, ldo);
  if constexpr (W > 1) {
    if (j < width) dot_columns<W / 2, R>(a, lda, bt + j, ldb, depth, width - j, out + j, ldo);
  }
}

/// out[r·ldo + j] = Σ_d a[r·lda + d] · bt[d·ldb + j] for r < rows, j < width, each a chain over
/// ascending d from +0.
template <int W>
[[gnu::always_inline]] inline void dot_rows(const float* a, std::int64_t lda, std::int64_t rows,
                                            const float* bt, std::int64_t ldb, std::int64_t depth,
                                            std::int64_t width, float* out, std::int64_t ldo) {
  constexpr int kRows = 4;
  std::int64_t r = 0;
  for (; r + kRows <= rows; r += kRows)
    dot_columns<W, kRows>(a + r * lda, lda, bt, ldb, depth, width, out + r * ldo, ldo);
  for (; r < rows; ++r)
    dot_columns<W, 1>(a + r * lda, lda, bt, ldb, depth, width, out + r * ldo, ldo);
}

// ---- Weighted sums of rows: out[r][e] += Σ_k w[r][k] · x[k][e] ------------------------------

/// Where a weighted sum reads its weights: w(r, k) = w[r·row + k·step].
struct Weights {
  const float* w;
  std::int64_t row;
  std::int64_t step;
  [[gnu::always_inline]] float at(std::int64_t r, std::int64_t k) const {
    return w[r * row + k * step];
  }
};

/// R output rows by NV vectors: each out element continues its chain with w(r, k) · x[k·ldx + e]
/// for k in [lo, hi) ascending.
template <int W, int R, int NV>
[[gnu::always_inline]] inline void weighted_tile(Weights w, std::int64_t r0, const float* x,
                                                 std::int64_t ldx, std::int64_t lo, std::int64_t hi,
                                                 float* out, std::int64_t ldo) {
  Vec<W> acc[R][NV];
  move_tile<W, R, NV, true>(acc, out, ldo);
  accumulate_tile<W, R, NV>(
      acc, lo, hi, [=](int r, std::int64_t k) { return w.at(r0 + r, k); },
      [=](std::int64_t k) { return x + k * ldx; });
  move_tile<W, R, NV, false>(acc, out, ldo);
}

/// Rows [0, rows) of NV vectors each, row r over its own range [lo(r), hi(r)): a tile of R rows
/// runs the range they share together, and each row's head before it and tail after it alone,
/// so every chain keeps its ascending order.
template <int W, int NV, class Range>
[[gnu::always_inline]] inline void weighted_vectors(Weights w, std::int64_t rows, Range range,
                                                    const float* x, std::int64_t ldx, float* out,
                                                    std::int64_t ldo) {
  constexpr int kRows = std::clamp(kAccumulators<W> / NV, 1, 8);
  // Row r alone over [lo, hi) of its range.
  const auto one_row = [&](std::int64_t r, std::int64_t lo, std::int64_t hi) {
    weighted_tile<W, 1, NV>(w, r, x, ldx, lo, hi, out + r * ldo, ldo);
  };
  std::int64_t r0 = 0;
  for (; r0 + kRows <= rows; r0 += kRows) {
    std::int64_t shared_lo = range(r0).first;
    std::int64_t shared_hi = range(r0).second;
    for (int r = 1; r < kRows; ++r) {
      shared_lo = std::max(shared_lo, range(r0 + r).first);
      shared_hi = std::min(shared_hi, range(r0 + r).second);
    }
    if (shared_lo >= shared_hi) {
      for (int r = 0; r < kRows; ++r)
        one_row(r0 + r, range(r0 + r).first, range(r0 + r).second);
      continue;
    }
    for (int r = 0; r < kRows; ++r)
      one_row(r0 + r, range(r0 + r).first, shared_lo);
    weighted_tile<W, kRows, NV>(w, r0, x, ldx, shared_lo, shared_hi, out + r0 * ldo, ldo);
    for (int r = 0; r < kRows; ++r)
      one_row(r0 + r, shared_hi, range(r0 + r).second);
  }
  for (; r0 < rows; ++r0)
    one_row(r0, range(r0).first, range(r0).second);
}

/// weighted_vectors over `columns` = nv·W columns, nv known at run time (1 to 8).
template <int W, class Range>
[[gnu::always_inline]] inline void weighted_columns(Weights w, std::int64_t rows, Range range,
                                                    const float* x, std::int64_t ldx,
                                                    std::int64_t nv, float* out, std::int64_t ldo) {
  switch (nv) {
    case 1:
      return weighted_vectors<W, 1>(w, rows, range, x, ldx, out, ldo);
    case 2:
      return weighted_vectors<W, 2>(w, rows, range, x, ldx, out, ldo);
    case 3:
      return weighted_vectors<W, 3>(w, rows, range, x, ldx, out, ldo);
    case 4:
      return weighted_vectors<W, 4>(w, rows, range, x, ldx, out, ldo);
    case 5:
      return weighted_vectors<W, 5>(w, rows, range, x, ldx, out, ldo);
    case 6:
      return weighted_vectors<W, 6>(w, rows, range, x, ldx, out, ldo);
    case 7:
      return weighted_vectors<W, 7>(w, rows, range, x, ldx, out, ldo);
    default:
      return weighted_vectors<W, 8>(w, rows, range, x, ldx, out, ldo);
  }
}

/// out[r·ldo + e] continues its chain with w(r, k) · x[k·ldx + e] for k in range(r) = [lo, hi)
/// ascending, for r < rows and e < columns. The lanes are the widest of W, W/2, .. 1 that divide
/// `columns`, at most 8 vectors a pass.
template <int W, class Range>
[[gnu::always_inline]] inline void weighted_rows(Weights w, std::int64_t rows, Range range,
                                                 const float* x, std::int64_t ldx,
                                                 std::int64_t columns, float* out,
                                                 std::int64_t ldo) {
  if constexpr (W > 1) {
    if (columns % W != 0) return weighted_rows<W / 2>(w, rows, range, x, ldx, columns, out, ldo);
  }
  for (std::int64_t e = 0; e < columns; e += 8 * W) {
    const std::int64_t nv = std::min<std::int64_t>(8, (columns - e) / W);
    weighted_columns<W>(w, rows, range, x + e, ldx, nv, out + e, ldo);
  }
}

}  // namespace meshtensor::kernels::lanes
