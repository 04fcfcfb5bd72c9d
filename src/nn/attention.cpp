#include <algorithm>
#include <cmath>
#include <utility>

#include <fmt/format.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/core/random.hpp>
#include <meshtensor/kernels/attention.hpp>
#include <meshtensor/nn/attention.hpp>

namespace meshtensor::nn {

namespace {

/// Columns [column, column + width) of rows [0, length) of a row-major matrix with `stride`
/// columns, copied into `out` as [length, width] (transposed: [width, length]).
void copy_block(const float* matrix, std::int64_t stride, std::int64_t column, std::int64_t length,
                std::int64_t width, bool transpose, float* out) {
  for (std::int64_t i = 0; i < length; ++i) {
    const float* row = matrix + i * stride + column;
    for (std::int64_t d = 0; d < width; ++d) {
      if (transpose) {
        out[d * length + i] = row[d];
      } else {
        out[i * width + d] = row[d];
      }
    }
  }
}

/// Adds [length, width] `block` into columns [column, column + width) of a row-major matrix.
void store_block(const float* block, std::int64_t length, std::int64_t width, float* matrix,
                 std::int64_t stride, std::int64_t column) {
  for (std::int64_t i = 0; i < length; ++i)
    std::copy_n(block + i * width, width, matrix + i * stride + column);
}

}  // namespace

CausalSelfAttention::CausalSelfAttention(std::int64_t dim, std::int64_t heads, std::uint64_t seed,
                                         double init_std, double projection_std)
    : dim_(dim),
      heads_(heads),
      qkv_(dim, 3 * dim, mix64(seed ^ 0x716b76ULL), init_std),
      projection_(dim, dim, mix64(seed ^ 0x70726f6aULL), projection_std) {
  if (heads <= 0 || dim % heads != 0) {
    throw InvalidArgument(
        fmt::format("attention: dim {} does not split into {} heads", dim, heads));
  }
  prefix_parameter_names(qkv_, "qkv");
  prefix_parameter_names(projection_, "proj");
}

std::vector<Parameter*> CausalSelfAttention::parameters() {
  return {&qkv_.weight(), &qkv_.bias(), &projection_.weight(), &projection_.bias()};
}

std::string CausalSelfAttention::describe() const {
  return fmt::format("CausalSelfAttention({}, heads={})", dim_, heads_);
}

std::int64_t CausalSelfAttention::local_heads() const {
  return qkv_.weight().value.shape()[1] / (3 * head_dim());
}

void CausalSelfAttention::set_decode(const DecodeRows* rows, KeyValueCache* cache) {
  if (rows != nullptr &&
      (cache == nullptr || cache->heads() != local_heads() || cache->head_dim() != head_dim())) {
    throw InvalidArgument(fmt::format("{}: decoding needs a cache of {} heads of {} values",
                                      describe(), local_heads(), head_dim()));
  }
  decode_rows_ = rows;
  cache_ = rows != nullptr ? cache : nullptr;
}

Tensor CausalSelfAttention::forward_decode(const Tensor& input) {
  const DecodeRows& rows = *decode_rows_;
  if (input.shape()[0] != 1 || input.shape()[1] != rows.size()) {
    throw InvalidArgument(fmt::format("{}: decoding takes [1, {}, {}], got {}", describe(),
                                      rows.size(), dim_, input.shape().to_string()));
  }
  const Tensor qkv_rows = run_forward(qkv_, input);
  const std::int64_t head_dim = this->head_dim();
  const std::int64_t stride = qkv_rows.shape()[2];
  const std::int64_t heads = stride / (3 * head_dim);
  const std::int64_t context = cache_->context();
  const float* qkv = qkv_rows.values<float>().data();
  // Every row's keys and values first: rows of one slot see the earlier rows of this call.
  for (std::int64_t r = 0; r < rows.size(); ++r) {
    const std::int64_t slot = rows.slots[static_cast<std::size_t>(r)];
    const std::int64_t position = rows.positions[static_cast<std::size_t>(r)];
    for (std::int64_t h = 0; h < heads; ++h) {
      const float* row = qkv + r * stride + h * 3 * head_dim;
      float* keys_t = cache_->keys_t(slot, h);
      for (std::int64_t d = 0; d < head_dim; ++d)
        keys_t[d * context + position] = row[head_dim + d];
      std::copy_n(row + 2 * head_dim, head_dim, cache_->values(slot, h) + position * head_dim);
    }
  }
  Tensor attended = Tensor::uninitialized(Shape{1, rows.size(), heads * head_dim}, DType::f32);
  std::vector<float> probabilities(static_cast<std::size_t>(context));
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim)));
  float* out = attended.values<float>().data();
  for (std::int64_t r = 0; r < rows.size(); ++r) {
    const std::int64_t slot = rows.slots[static_cast<std::size_t>(r)];
    const std::int64_t position = rows.positions[static_cast<std::size_t>(r)];
    for (std::int64_t h = 0; h < heads; ++h) {
      const kernels::HeadCache cache{cache_->keys_t(slot, h), cache_->values(slot, h), context,
                                     head_dim};
      kernels::attention_row(qkv + r * stride + h * 3 * head_dim, cache, position + 1, scale,
                             probabilities.data(), out + (r * heads + h) * head_dim);
    }
  }
  return run_forward(projection_, attended);
}

Tensor CausalSelfAttention::forward(const Tensor& input) {
  if (!input.defined() || input.rank() != 3 || input.dtype() != DType::f32 ||
      input.shape()[2] != dim_) {
    throw InvalidArgument(fmt::format("{} needs f32 [batch, sequence, {}], got {}", describe(),
                                      dim_, input.defined() ? input.shape().to_string() : "none"));
  }
  if (decode_rows_ != nullptr) return forward_decode(input);
  qkv_values_ = run_forward(qkv_, input);
  const std::int64_t batch = qkv_values_.shape()[0];
  const std::int64_t length = qkv_values_.shape()[1];
  const std::int64_t head_dim = dim_ / heads_;
  const std::int64_t stride = qkv_values_.shape()[2];  // 3 * the local heads' dims
  const std::int64_t heads = stride / (3 * head_dim);
  row_stats_ = Tensor::uninitialized(Shape{batch, heads, length, 2}, DType::f32);
  Tensor attended = Tensor::uninitialized(Shape{batch, length, heads * head_dim}, DType::f32);
  std::vector<float> keys_t(static_cast<std::size_t>(head_dim * length));
  std::vector<float> values(static_cast<std::size_t>(length * head_dim));
  std::vector<float> probabilities(static_cast<std::size_t>(length));
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim)));
  const float* qkv = qkv_values_.values<float>().data();
  auto* stats = reinterpret_cast<kernels::RowStats*>(row_stats_.values<float>().data());
  float* out = attended.values<float>().data();
  for (std::int64_t b = 0; b < batch; ++b) {
    const float* sequence = qkv + b * length * stride;
    for (std::int64_t h = 0; h < heads; ++h) {
      const std::int64_t query = h * 3 * head_dim;
      copy_block(sequence, stride, query + head_dim, length, head_dim, true, keys_t.data());
      copy_block(sequence, stride, query + 2 * head_dim, length, head_dim, false, values.data());
      const kernels::HeadCache cache{keys_t.data(), values.data(), length, head_dim};
      kernels::RowStats* head_stats = stats + (b * heads + h) * length;
      for (std::int64_t i = 0; i < length; ++i) {
        kernels::attention_row(
            sequence + i * stride + query, cache, i + 1, scale, probabilities.data(),
            out + (b * length + i) * heads * head_dim + h * head_dim, head_stats + i);
      }
    }
  }
  return run_forward(projection_, attended);
}

Tensor CausalSelfAttention::backward(const Tensor& grad_output, GradientSink& sink,
                                     bool need_input_grad) {
  if (!qkv_values_.defined()) throw InvalidArgument(describe() + ": backward without a forward");
  const Tensor grad_attended = run_backward(projection_, grad_output, sink, true);
  const std::int64_t batch = qkv_values_.shape()[0];
  const std::int64_t length = qkv_values_.shape()[1];
  const std::int64_t head_dim = dim_ / heads_;
  const std::int64_t stride = qkv_values_.shape()[2];
  const std::int64_t heads = stride / (3 * head_dim);
  const std::int64_t attended_width = heads * head_dim;
  const std::size_t block = static_cast<std::size_t>(length * head_dim);
  std::vector<float> queries(block), keys(block), keys_t(block), values_t(block), grad_out(block);
  std::vector<float> grad_q(block), grad_k(block), grad_v(block);
  Tensor grad_qkv = Tensor::uninitialized(qkv_values_.shape(), DType::f32);
  const float* qkv = qkv_values_.values<float>().data();
  const float* d_attended = grad_attended.values<float>().data();
  float* d_qkv = grad_qkv.values<float>().data();
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim)));
  for (std::int64_t b = 0; b < batch; ++b) {
    const float* sequence = qkv + b * length * stride;
    float* d_sequence = d_qkv + b * length * stride;
    for (std::int64_t h = 0; h < heads; ++h) {
      const std::int64_t query = h * 3 * head_dim;
      copy_block(sequence, stride, query, length, head_dim, false, queries.data());
      copy_block(sequence, stride, query + head_dim, length, head_dim, false, keys.data());
      copy_block(sequence, stride, query + head_dim, length, head_dim, true, keys_t.data());
      copy_block(sequence, stride, query + 2 * head_dim, length, head_dim, true, values_t.data());
      copy_block(d_attended + b * length * attended_width, attended_width, h * head_dim, length,
                 head_dim, false, grad_out.data());
      kernels::HeadGradientInputs in;
      in.queries = queries.data();
      in.keys = keys.data();
      in.keys_t = keys_t.data();
      in.values_t = values_t.data();
      in.stats = reinterpret_cast<const kernels::RowStats*>(row_stats_.values<float>().data()) +
                 (b * heads + h) * length;
      in.grad_output = grad_out.data();
      in.length = length;
      in.head_dim = head_dim;
      in.scale = scale;
      kernels::attention_backward(in, grad_q.data(), grad_k.data(), grad_v.data());
      store_block(grad_q.data(), length, head_dim, d_sequence, stride, query);
      store_block(grad_k.data(), length, head_dim, d_sequence, stride, query + head_dim);
      store_block(grad_v.data(), length, head_dim, d_sequence, stride, query + 2 * head_dim);
    }
  }
  qkv_values_ = Tensor();
  row_stats_ = Tensor();
  return run_backward(qkv_, grad_qkv, sink, need_input_grad);
}

std::vector<std::pair<std::string, Module*>> CausalSelfAttention::children() {
  return {{"qkv", &qkv_}, {"proj", &projection_}};
}

void CausalSelfAttention::set_exact_blocks(bool on) {
  qkv_.set_exact_blocks(0, on ? heads_ : 0);
  projection_.set_exact_blocks(on ? heads_ : 0, 0);
}

SavedState CausalSelfAttention::take_saved() {
  SavedState saved;
  saved.tensors.push_back(std::exchange(qkv_values_, Tensor()));
  saved.tensors.push_back(std::exchange(row_stats_, Tensor()));
  return saved;
}

void CausalSelfAttention::restore_saved(SavedState saved) {
  qkv_values_ = std::move(saved.tensors.at(0));
  row_stats_ = std::move(saved.tensors.at(1));
}

}  // namespace meshtensor::nn
