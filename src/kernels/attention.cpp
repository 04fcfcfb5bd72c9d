#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

#include <meshtensor/kernels/activation.hpp>
#include <meshtensor/kernels/attention.hpp>

#include "simd_dispatch.hpp"

namespace meshtensor::kernels {

namespace {

/// out[j] = Σ_d row[d] · columns[d * stride + j] for j < count, each a chain over ascending d.
template <class T>
[[gnu::always_inline]] inline void row_times_columns(const T* row, const T* columns,
                                                     std::int64_t stride, std::int64_t depth,
                                                     std::int64_t count, T* out) {
  std::fill(out, out + count, T(0));
  for (std::int64_t d = 0; d < depth; ++d) {
    const T factor = row[d];
    const T* column = columns + d * stride;
    for (std::int64_t j = 0; j < count; ++j)
      out[j] = out[j] + factor * column[j];
  }
}

/// out[d] = Σ_j weights[j] · rows[j * depth + d] for j < count, each a chain over ascending j.
template <class T>
[[gnu::always_inline]] inline void weighted_rows(const T* weights, const T* rows,
                                                 std::int64_t count, std::int64_t depth, T* out) {
  std::fill(out, out + depth, T(0));
  for (std::int64_t j = 0; j < count; ++j) {
    const T weight = weights[j];
    const T* row = rows + j * depth;
    for (std::int64_t d = 0; d < depth; ++d)
      out[d] = out[d] + weight * row[d];
  }
}

template <class T>
[[gnu::always_inline]] inline void attention_row_body(const T* query, const T* keys_t,
                                                      const T* values, std::int64_t stride,
                                                      std::int64_t head_dim, std::int64_t count,
                                                      T scale, T* p, T* output, RowStats* stats) {
  row_times_columns(query, keys_t, stride, head_dim, count, p);
  T largest = p[0] * scale;
  bool nan = false;
  for (std::int64_t j = 0; j < count; ++j) {
    p[j] = p[j] * scale;
    largest = std::max(largest, p[j]);
    nan = nan || p[j] != p[j];
  }
  for (std::int64_t j = 0; j < count; ++j)
    p[j] = exp_f32(p[j] - largest);
  T total = 0;
  for (std::int64_t j = 0; j < count; ++j)
    total = total + p[j];
  const T nan_value = std::numeric_limits<T>::quiet_NaN();
  for (std::int64_t j = 0; j < count; ++j)
    p[j] = nan ? nan_value : p[j] / total;
  weighted_rows(p, values, count, head_dim, output);
  if (stats != nullptr) *stats = {largest, nan ? nan_value : total};
}

/// Row i's probabilities again, with attention_row_body's operations: exp(s·scale - largest) /
/// total (a NaN total makes every one NaN, as the forward's).
template <class T>
[[gnu::always_inline]] inline void recompute_row(const HeadGradientInputs& in, const T* query,
                                                 RowStats stats, std::int64_t first,
                                                 std::int64_t count, T* p) {
  row_times_columns(query, in.keys_t + first, in.length, in.head_dim, count, p);
  for (std::int64_t j = 0; j < count; ++j)
    p[j] = exp_f32(p[j] * in.scale - stats.largest) / stats.total;
}

/// The query side of row i (position `position`): p and dS of keys 0 .. position in `p` and
/// `dp`, dQ into `dq`; returns Σ_j p_j dP_j.
template <class T>
[[gnu::always_inline]] inline T query_side(const HeadGradientInputs& in, const T* query,
                                           const T* d_out, RowStats stats, std::int64_t position,
                                           T* dp, T* p, T* dq) {
  const std::int64_t count = position + 1;
  recompute_row(in, query, stats, 0, count, p);
  row_times_columns(d_out, in.values_t, in.length, in.head_dim, count, dp);
  T weighted = 0;
  for (std::int64_t j = 0; j < count; ++j)
    weighted = weighted + p[j] * dp[j];
  for (std::int64_t j = 0; j < count; ++j)
    dp[j] = p[j] * (dp[j] - weighted) * in.scale;  // dS_ij
  weighted_rows(dp, in.keys, count, in.head_dim, dq);
  return weighted;
}

/// Adds row i's terms to the gradients of `count` keys from `first` (dS and p of those keys in
/// `ds` and `p`): dK_j += dS_ij q_i, dV_j += p_ij dO_i.
template <class T>
[[gnu::always_inline]] inline void add_key_terms(const T* ds, const T* p, const T* q,
                                                 const T* d_out, std::int64_t count,
                                                 std::int64_t hd, T* dk, T* dv) {
  for (std::int64_t j = 0; j < count; ++j) {
    const T dsj = ds[j];
    const T pj = p[j];
    T* dk_row = dk + j * hd;
    T* dv_row = dv + j * hd;
    for (std::int64_t d = 0; d < hd; ++d) {
      dk_row[d] = dk_row[d] + dsj * q[d];
      dv_row[d] = dv_row[d] + pj * d_out[d];
    }
  }
}
MESHTENSOR_SIMD_KERNEL(attention_row_kernel, attention_row_body)

template <class T>
[[gnu::always_inline]] inline void attention_backward_row(const HeadGradientInputs& in,
                                                          std::int64_t i, T* dp, T* p, T* dq, T* dk,
                                                          T* dv) {
  const std::int64_t hd = in.head_dim;
  const T* q = in.queries + i * hd;
  const T* d_out = in.grad_output + i * hd;
  query_side(in, q, d_out, in.stats[i], i, dp, p, dq + i * hd);
  add_key_terms(dp, p, q, d_out, i + 1, hd, dk, dv);
}

template <class T>
[[gnu::always_inline]] inline void attention_backward_body(const HeadGradientInputs* in, T* dq,
                                                           T* dk, T* dv, T* scratch) {
  const std::size_t bytes = sizeof(T) * static_cast<std::size_t>(in->length * in->head_dim);
  std::memset(dk, 0, bytes);
  std::memset(dv, 0, bytes);
  for (std::int64_t i = 0; i < in->length; ++i)
    attention_backward_row(*in, i, scratch, scratch + in->length, dq, dk, dv);
}
MESHTENSOR_SIMD_KERNEL(attention_backward_kernel, attention_backward_body)

template <class T>
[[gnu::always_inline]] inline void query_backward_body(const HeadGradientInputs* in,
                                                       const std::int64_t* positions,
                                                       std::int64_t rows, T* dq, T* weighted,
                                                       T* scratch) {
  const std::int64_t hd = in->head_dim;
  for (std::int64_t r = 0; r < rows; ++r) {
    weighted[r] = query_side(*in, in->queries + r * hd, in->grad_output + r * hd, in->stats[r],
                             positions[r], scratch, scratch + in->length, dq + r * hd);
  }
}
MESHTENSOR_SIMD_KERNEL(query_backward_kernel, query_backward_body)

/// Row i's dS and p over keys [first, first + count) (count of them at or before i), with the
/// row's Σ p dP from the query side: the operations of query_side, key by key.
template <class T>
[[gnu::always_inline]] inline void key_side(const HeadGradientInputs& in, std::int64_t i,
                                            std::int64_t first, std::int64_t count, T* ds, T* p) {
  const std::int64_t hd = in.head_dim;
  recompute_row(in, in.queries + i * hd, in.stats[i], first, count, p);
  row_times_columns(in.grad_output + i * hd, in.values_t + first, in.length, hd, count, ds);
  const T weighted = in.weighted[i];
  for (std::int64_t j = 0; j < count; ++j)
    ds[j] = p[j] * (ds[j] - weighted) * in.scale;
}

template <class T>
[[gnu::always_inline]] inline void key_backward_body(const HeadGradientInputs* in,
                                                     std::int64_t first, std::int64_t count, T* dk,
                                                     T* dv, T* scratch) {
  const std::int64_t hd = in->head_dim;
  const std::size_t bytes = sizeof(T) * static_cast<std::size_t>(count * hd);
  std::memset(dk, 0, bytes);
  std::memset(dv, 0, bytes);
  for (std::int64_t i = first; i < in->length; ++i) {
    const std::int64_t seen = std::min(count, i - first + 1);
    key_side(*in, i, first, seen, scratch, scratch + count);
    add_key_terms(scratch, scratch + count, in->queries + i * hd, in->grad_output + i * hd, seen,
                  hd, dk, dv);
  }
}
MESHTENSOR_SIMD_KERNEL(key_backward_kernel, key_backward_body)

}  // namespace

void attention_query_backward(const HeadGradientInputs& in, const std::int64_t* positions,
                              std::int64_t rows, float* grad_queries, float* weighted) {
  if (rows <= 0) return;
  thread_local std::vector<float> scratch;
  scratch.resize(static_cast<std::size_t>(2 * in.length));
  query_backward_kernel<float>(&in, positions, rows, grad_queries, weighted, scratch.data());
}

void attention_key_backward(const HeadGradientInputs& in, std::int64_t first, std::int64_t count,
                            float* grad_keys, float* grad_values) {
  if (count <= 0) return;
  thread_local std::vector<float> scratch;
  scratch.resize(static_cast<std::size_t>(2 * count));
  key_backward_kernel<float>(&in, first, count, grad_keys, grad_values, scratch.data());
}

void attention_row(const float* query, const HeadCache& cache, std::int64_t count, float scale,
                   float* probabilities, float* output, RowStats* stats) {
  if (count <= 0) return;
  attention_row_kernel<float>(query, cache.keys_t, cache.values, cache.stride, cache.head_dim,
                              count, scale, probabilities, output, stats);
}

void attention_backward(const HeadGradientInputs& in, float* grad_queries, float* grad_keys,
                        float* grad_values) {
  if (in.length <= 0) return;
  thread_local std::vector<float> scratch;
  scratch.resize(static_cast<std::size_t>(2 * in.length));
  attention_backward_kernel<float>(&in, grad_queries, grad_keys, grad_values, scratch.data());
}

}  // namespace meshtensor::kernels
