#include <algorithm>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include <meshtensor/kernels/activation.hpp>
#include <meshtensor/kernels/attention.hpp>

#include "lanes.hpp"
#include "simd_dispatch.hpp"

namespace meshtensor::kernels {

namespace {

/// Query rows a tile of the kernels below works on at once: each key and value a tile loads
/// serves this many rows.
constexpr std::int64_t kTileRows = 32;

/// A thread's scratch for the tiles of up to `width` keys: the probabilities p, the score
/// gradients dS and the products p·dP, each kTileRows rows of `width` (tile_scratch).
struct TileScratch {
  float* p;
  float* ds;
  float* products;
};

/// Chain ranges [0, counts[r]) of a tile's rows.
struct Prefixes {
  const std::int64_t* counts;
  [[gnu::always_inline]] std::pair<std::int64_t, std::int64_t> operator()(std::int64_t r) const {
    return {0, counts[r]};
  }
};

/// Rows whose chains row_chains runs side by side: as many as the registers hold.
constexpr std::int64_t kChainRows = 16;
static_assert(kTileRows % kChainRows == 0);

/// Each row's chain state[r] = step(state[r], rows[r·ld + j]) for j < counts[r] ascending, for
/// up to kChainRows rows side by side: independent chains overlap, where one alone would wait
/// out each step's latency. The steps every row has run for all kChainRows rows at once (rows
/// past `n` are scratch of the tile whose results are dropped), the rest row by row.
template <class Step>
[[gnu::always_inline]] inline void chain_group(const float* rows, std::int64_t ld,
                                               const std::int64_t* counts, std::int64_t n,
                                               float* state, Step step) {
  std::int64_t shared = counts[0];
  for (std::int64_t r = 1; r < n; ++r)
    shared = std::min(shared, counts[r]);
  float s[kChainRows] = {};
  std::copy_n(state, n, s);
  for (std::int64_t j = 0; j < shared; ++j) {
#pragma GCC unroll 16
    for (std::int64_t r = 0; r < kChainRows; ++r)
      s[r] = step(s[r], rows[r * ld + j]);
  }
  for (std::int64_t r = 0; r < n; ++r) {
    float x = s[r];
    for (std::int64_t j = shared; j < counts[r]; ++j)
      x = step(x, rows[r * ld + j]);
    state[r] = x;
  }
}

/// chain_group over the n rows of a tile, kChainRows at a time.
template <class Step>
[[gnu::always_inline]] inline void row_chains(const float* rows, std::int64_t ld,
                                              const std::int64_t* counts, std::int64_t n,
                                              float* state, Step step) {
  for (std::int64_t g = 0; g < n; g += kChainRows)
    chain_group(rows + g * ld, ld, counts + g, std::min(kChainRows, n - g), state + g, step);
}

[[gnu::always_inline]] inline float add_step(float sum, float x) {
  return sum + x;
}

[[gnu::always_inline]] inline float max_step(float largest, float x) {
  return std::max(largest, x);
}

/// A tile's scores into probabilities in place, row r over its counts[r] keys: scaled, less
/// their largest, exponentiated, over their sum (ascending j); a NaN score makes every
/// probability of its row NaN. Each row's stats into stats[r] when given.
[[gnu::always_inline]] inline void softmax_tile(float* p, std::int64_t ld,
                                                const std::int64_t* counts, std::int64_t n,
                                                float scale, RowStats* stats) {
  float largest[kTileRows];
  float total[kTileRows] = {};
  bool nan[kTileRows];
  for (std::int64_t r = 0; r < n; ++r) {
    float* row = p + r * ld;
    largest[r] = row[0] * scale;
    std::int32_t nans = 0;  // a count, not a flag: the loop vectorises
    for (std::int64_t j = 0; j < counts[r]; ++j) {
      row[j] = row[j] * scale;
      nans += row[j] != row[j] ? 1 : 0;
    }
    nan[r] = nans != 0;
  }
  row_chains(p, ld, counts, n, largest, max_step);
  for (std::int64_t r = 0; r < n; ++r) {
    float* row = p + r * ld;
    for (std::int64_t j = 0; j < counts[r]; ++j)
      row[j] = exp_f32(row[j] - largest[r]);
  }
  row_chains(p, ld, counts, n, total, add_step);
  const float nan_value = std::numeric_limits<float>::quiet_NaN();
  for (std::int64_t r = 0; r < n; ++r) {
    float* row = p + r * ld;
    for (std::int64_t j = 0; j < counts[r]; ++j)
      row[j] = nan[r] ? nan_value : row[j] / total[r];
    if (stats != nullptr) stats[r] = {largest[r], nan[r] ? nan_value : total[r]};
  }
}

/// Up to kTileRows rows at a time: scores against keys 0 .. the tile's last, each row's softmax
/// over its own keys, then the outputs as weighted sums of the values.
template <int W>
[[gnu::always_inline]] inline void attention_rows_body(
    const float* queries, std::int64_t query_stride, const std::int64_t* positions,
    std::int64_t rows, HeadCache cache, float scale, float* output, std::int64_t output_stride,
    RowStats* stats, float* p) {
  const std::int64_t hd = cache.head_dim;
  std::int64_t counts[kTileRows];
  for (std::int64_t r0 = 0; r0 < rows; r0 += kTileRows) {
    const std::int64_t n = std::min(kTileRows, rows - r0);
    std::int64_t width = 0;
    for (std::int64_t r = 0; r < n; ++r) {
      counts[r] = positions[r0 + r] + 1;
      width = std::max(width, counts[r]);
    }
    lanes::dot_rows<W>(queries + r0 * query_stride, query_stride, n, cache.keys_t, cache.stride, hd,
                       width, p, width);
    softmax_tile(p, width, counts, n, scale, stats != nullptr ? stats + r0 : nullptr);
    float* out = output + r0 * output_stride;
    for (std::int64_t r = 0; r < n; ++r)
      std::fill_n(out + r * output_stride, hd, 0.0f);
    lanes::weighted_rows<W>({p, width, 1}, n, Prefixes{counts}, cache.values, hd, hd, out,
                            output_stride);
  }
}
MESHTENSOR_LANES_KERNEL(attention_rows_kernel, attention_rows_body)

/// One tile of backward rows (queries q, output gradients d_out and stats of `rows` rows, each
/// [rows, head_dim] contiguous), row r seeing keys [first, first + seen[r]): their
/// probabilities p recomputed with the forward's operations, and dS_ij = p_ij (dP_ij - Σ p dP)
/// ·scale into the scratch's p and ds (both [rows, width]). Σ p dP over the row's keys is computed
/// into `computed` when given (the query side, first = 0), else read from `given` (the key side).
template <int W>
[[gnu::always_inline]] inline void gradient_tile(const HeadGradientInputs& in, const float* q,
                                                 const float* d_out, const RowStats* stats,
                                                 const std::int64_t* seen, std::int64_t rows,
                                                 std::int64_t first, std::int64_t width,
                                                 const float* given, float* computed,
                                                 TileScratch scratch) {
  float* p = scratch.p;
  float* ds = scratch.ds;
  const std::int64_t hd = in.head_dim;
  lanes::dot_rows<W>(q, hd, rows, in.keys_t + first, in.length, hd, width, p, width);
  lanes::dot_rows<W>(d_out, hd, rows, in.values_t + first, in.length, hd, width, ds, width);
  for (std::int64_t r = 0; r < rows; ++r) {
    float* pr = p + r * width;
    const float* dpr = ds + r * width;
    float* products = scratch.products + r * width;
    for (std::int64_t j = 0; j < seen[r]; ++j) {
      pr[j] = exp_f32(pr[j] * in.scale - stats[r].largest) / stats[r].total;
      products[j] = pr[j] * dpr[j];
    }
  }
  float sums[kTileRows] = {};
  if (computed != nullptr) {
    row_chains(scratch.products, width, seen, rows, sums, add_step);
    std::copy_n(sums, rows, computed);
  } else {
    for (std::int64_t r = 0; r < rows; ++r)
      sums[r] = given[r];
  }
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* pr = p + r * width;
    float* dsr = ds + r * width;
    for (std::int64_t j = 0; j < seen[r]; ++j)
      dsr[j] = pr[j] * (dsr[j] - sums[r]) * in.scale;
  }
}

/// The query side of a tile of rows at `positions`: dQ_i = Σ_j dS_ij k_j (ascending j) into dq
/// and each row's Σ p dP into `weighted`; leaves p and dS of keys 0 .. the tile's last in the
/// scratch (row stride: the returned width).
template <int W>
[[gnu::always_inline]] inline std::int64_t query_side_tile(const HeadGradientInputs& in,
                                                           const float* q, const float* d_out,
                                                           const RowStats* stats,
                                                           const std::int64_t* positions,
                                                           std::int64_t rows, float* dq,
                                                           float* weighted, TileScratch scratch) {
  const std::int64_t hd = in.head_dim;
  std::int64_t seen[kTileRows];
  std::int64_t width = 0;
  for (std::int64_t r = 0; r < rows; ++r) {
    seen[r] = positions[r] + 1;
    width = std::max(width, seen[r]);
  }
  gradient_tile<W>(in, q, d_out, stats, seen, rows, 0, width, nullptr, weighted, scratch);
  std::fill_n(dq, rows * hd, 0.0f);
  lanes::weighted_rows<W>({scratch.ds, width, 1}, rows, Prefixes{seen}, in.keys, hd, hd, dq, hd);
  return width;
}

/// Adds a tile's rows (global rows row_first .. row_first + rows - 1, each seeing the keys at or
/// before it, their p and dS in the scratch) to the gradients of keys [key_first, key_first +
/// width): dK_j += dS_ij q_i and dV_j += p_ij dO_i, rows ascending.
template <int W>
[[gnu::always_inline]] inline void key_terms_tile(const HeadGradientInputs& in, TileScratch scratch,
                                                  std::int64_t width, std::int64_t rows,
                                                  std::int64_t key_first, std::int64_t row_first,
                                                  float* dk, float* dv) {
  const std::int64_t hd = in.head_dim;
  const auto range = [=](std::int64_t key) {
    return std::pair<std::int64_t, std::int64_t>{
        std::max<std::int64_t>(0, key_first + key - row_first), rows};
  };
  const float* q = in.queries + row_first * hd;
  const float* d_out = in.grad_output + row_first * hd;
  lanes::weighted_rows<W>({scratch.ds, 1, width}, width, range, q, hd, hd, dk, hd);
  lanes::weighted_rows<W>({scratch.p, 1, width}, width, range, d_out, hd, hd, dv, hd);
}

template <int W>
[[gnu::always_inline]] inline void attention_backward_body(const HeadGradientInputs* in, float* dq,
                                                           float* dk, float* dv,
                                                           TileScratch scratch) {
  const std::int64_t hd = in->head_dim;
  const std::size_t bytes = sizeof(float) * static_cast<std::size_t>(in->length * hd);
  std::memset(dk, 0, bytes);
  std::memset(dv, 0, bytes);
  float weighted[kTileRows];
  std::int64_t positions[kTileRows];
  for (std::int64_t i0 = 0; i0 < in->length; i0 += kTileRows) {
    const std::int64_t rows = std::min(kTileRows, in->length - i0);
    for (std::int64_t r = 0; r < rows; ++r)
      positions[r] = i0 + r;
    const std::int64_t width =
        query_side_tile<W>(*in, in->queries + i0 * hd, in->grad_output + i0 * hd, in->stats + i0,
                           positions, rows, dq + i0 * hd, weighted, scratch);
    key_terms_tile<W>(*in, scratch, width, rows, 0, i0, dk, dv);
  }
}
MESHTENSOR_LANES_KERNEL(attention_backward_kernel, attention_backward_body)

template <int W>
[[gnu::always_inline]] inline void query_backward_body(const HeadGradientInputs* in,
                                                       const std::int64_t* positions,
                                                       std::int64_t rows, float* dq,
                                                       float* weighted, TileScratch scratch) {
  const std::int64_t hd = in->head_dim;
  for (std::int64_t r0 = 0; r0 < rows; r0 += kTileRows) {
    const std::int64_t n = std::min(kTileRows, rows - r0);
    query_side_tile<W>(*in, in->queries + r0 * hd, in->grad_output + r0 * hd, in->stats + r0,
                       positions + r0, n, dq + r0 * hd, weighted + r0, scratch);
  }
}
MESHTENSOR_LANES_KERNEL(query_backward_kernel, query_backward_body)

template <int W>
[[gnu::always_inline]] inline void key_backward_body(const HeadGradientInputs* in,
                                                     std::int64_t first, std::int64_t count,
                                                     float* dk, float* dv, TileScratch scratch) {
  const std::int64_t hd = in->head_dim;
  const std::size_t bytes = sizeof(float) * static_cast<std::size_t>(count * hd);
  std::memset(dk, 0, bytes);
  std::memset(dv, 0, bytes);
  std::int64_t seen[kTileRows];
  for (std::int64_t i0 = first; i0 < in->length; i0 += kTileRows) {
    const std::int64_t rows = std::min(kTileRows, in->length - i0);
    for (std::int64_t r = 0; r < rows; ++r)
      seen[r] = std::min(count, i0 + r - first + 1);
    const std::int64_t width = seen[rows - 1];
    gradient_tile<W>(*in, in->queries + i0 * hd, in->grad_output + i0 * hd, in->stats + i0, seen,
                     rows, first, width, in->weighted + i0, nullptr, scratch);
    key_terms_tile<W>(*in, scratch, width, rows, first, i0, dk, dv);
  }
}
MESHTENSOR_LANES_KERNEL(key_backward_kernel, key_backward_body)

TileScratch tile_scratch(std::int64_t width) {
  thread_local std::vector<float> scratch;
  const std::int64_t tile = kTileRows * width;
  scratch.resize(static_cast<std::size_t>(3 * tile));
  return {scratch.data(), scratch.data() + tile, scratch.data() + 2 * tile};
}

}  // namespace

void attention_rows(const float* queries, std::int64_t query_stride, const std::int64_t* positions,
                    std::int64_t rows, const HeadCache& cache, float scale, float* output,
                    std::int64_t output_stride, RowStats* stats) {
  if (rows <= 0) return;
  attention_rows_kernel(queries, query_stride, positions, rows, cache, scale, output, output_stride,
                        stats, tile_scratch(cache.stride).p);
}

void attention_row(const float* query, const HeadCache& cache, std::int64_t count, float scale,
                   float* probabilities, float* output, RowStats* stats) {
  if (count <= 0) return;
  const std::int64_t position = count - 1;
  float* p = tile_scratch(count).p;
  attention_rows_kernel(query, cache.head_dim, &position, std::int64_t{1}, cache, scale, output,
                        cache.head_dim, stats, p);
  std::copy_n(p, count, probabilities);
}

void attention_query_backward(const HeadGradientInputs& in, const std::int64_t* positions,
                              std::int64_t rows, float* grad_queries, float* weighted) {
  if (rows <= 0) return;
  query_backward_kernel(&in, positions, rows, grad_queries, weighted, tile_scratch(in.length));
}

void attention_key_backward(const HeadGradientInputs& in, std::int64_t first, std::int64_t count,
                            float* grad_keys, float* grad_values) {
  if (count <= 0) return;
  key_backward_kernel(&in, first, count, grad_keys, grad_values, tile_scratch(count));
}

void attention_backward(const HeadGradientInputs& in, float* grad_queries, float* grad_keys,
                        float* grad_values) {
  if (in.length <= 0) return;
  attention_backward_kernel(&in, grad_queries, grad_keys, grad_values, tile_scratch(in.length));
}

}  // namespace meshtensor::kernels
