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
[[gnu::always_inline]] inline void recompute_row(const HeadGradientInputs& in, std::int64_t i,
                                                 T* p) {
  const std::int64_t count = i + 1;
  row_times_columns(in.queries + i * in.head_dim, in.keys_t, in.length, in.head_dim, count, p);
  const RowStats stats = in.stats[i];
  for (std::int64_t j = 0; j < count; ++j)
    p[j] = exp_f32(p[j] * in.scale - stats.largest) / stats.total;
}
MESHTENSOR_SIMD_KERNEL(attention_row_kernel, attention_row_body)

template <class T>
[[gnu::always_inline]] inline void attention_backward_row(const HeadGradientInputs& in,
                                                          std::int64_t i, T* dp, T* p, T* dq, T* dk,
                                                          T* dv) {
  const std::int64_t hd = in.head_dim;
  const std::int64_t count = i + 1;
  recompute_row(in, i, p);
  const T* d_out = in.grad_output + i * hd;
  row_times_columns(d_out, in.values_t, in.length, hd, count, dp);
  T weighted = 0;
  for (std::int64_t j = 0; j < count; ++j)
    weighted = weighted + p[j] * dp[j];
  for (std::int64_t j = 0; j < count; ++j)
    dp[j] = p[j] * (dp[j] - weighted) * in.scale;  // dS_ij
  weighted_rows(dp, in.keys, count, hd, dq + i * hd);
  const T* q = in.queries + i * hd;
  for (std::int64_t j = 0; j < count; ++j) {
    const T ds = dp[j];
    const T pj = p[j];
    T* dk_row = dk + j * hd;
    T* dv_row = dv + j * hd;
    for (std::int64_t d = 0; d < hd; ++d) {
      dk_row[d] = dk_row[d] + ds * q[d];
      dv_row[d] = dv_row[d] + pj * d_out[d];
    }
  }
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

}  // namespace

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
