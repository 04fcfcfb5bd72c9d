#include <algorithm>
#include <cmath>
#include <utility>

#include <fmt/format.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/core/profile.hpp>
#include <meshtensor/core/random.hpp>
#include <meshtensor/kernels/attention.hpp>
#include <meshtensor/nn/attention.hpp>

#include "split_attention.hpp"

namespace meshtensor::nn {

namespace {

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

void CausalSelfAttention::set_sequence_split(SequenceSplit* split) {
  split_ = split;
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
  const float* qkv = qkv_rows.values<float>().data();
  check_cache_rows(rows, *cache_);
  // Every row's keys and values first: rows of one slot see the earlier rows of this call.
  for (std::int64_t r = 0; r < rows.size(); ++r) {
    const std::int64_t slot = rows.slots[static_cast<std::size_t>(r)];
    const std::int64_t position = rows.positions[static_cast<std::size_t>(r)];
    const std::int64_t context = cache_->capacity(slot);
    for (std::int64_t h = 0; h < heads; ++h) {
      const float* row = qkv + r * stride + h * 3 * head_dim;
      float* keys_t = cache_->keys_t(slot, h);
      for (std::int64_t d = 0; d < head_dim; ++d)
        keys_t[d * context + position] = row[head_dim + d];
      std::copy_n(row + 2 * head_dim, head_dim, cache_->values(slot, h) + position * head_dim);
    }
  }
  Tensor attended = Tensor::uninitialized(Shape{1, rows.size(), heads * head_dim}, DType::f32);
  std::vector<float> probabilities(static_cast<std::size_t>(cache_->context()));
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim)));
  float* out = attended.values<float>().data();
  for (std::int64_t r = 0; r < rows.size(); ++r) {
    const std::int64_t slot = rows.slots[static_cast<std::size_t>(r)];
    const std::int64_t position = rows.positions[static_cast<std::size_t>(r)];
    for (std::int64_t h = 0; h < heads; ++h) {
      const kernels::HeadCache cache{cache_->keys_t(slot, h), cache_->values(slot, h),
                                     cache_->capacity(slot), head_dim};
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
  const ProfileScope profile(ProfileRow::attention);
  const std::int64_t batch = qkv_values_.shape()[0];
  const std::int64_t length = qkv_values_.shape()[1];
  const std::int64_t head_dim = dim_ / heads_;
  const std::int64_t stride = qkv_values_.shape()[2];  // 3 * the local heads' dims
  const std::int64_t heads = stride / (3 * head_dim);
  const KeySource source = key_source();
  const std::vector<std::int64_t> positions = row_positions(split_, 1, length);
  row_stats_ = Tensor::uninitialized(Shape{batch, heads, length, 2}, DType::f32);
  Tensor attended = Tensor::uninitialized(Shape{batch, length, heads * head_dim}, DType::f32);
  std::vector<float> keys_t;
  std::vector<float> values;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim)));
  const float* qkv = qkv_values_.values<float>().data();
  auto* stats = reinterpret_cast<kernels::RowStats*>(row_stats_.values<float>().data());
  float* out = attended.values<float>().data();
  for (std::int64_t b = 0; b < batch; ++b) {
    const float* sequence = qkv + b * length * stride;
    for (std::int64_t h = 0; h < heads; ++h) {
      source.keys_of(b, h, head_dim, true, keys_t);
      source.values_of(b, h, head_dim, false, values);
      const kernels::HeadCache cache{keys_t.data(), values.data(), source.length, head_dim};
      kernels::attention_rows(sequence + h * 3 * head_dim, stride, positions.data(), length, cache,
                              scale, out + b * length * heads * head_dim + h * head_dim,
                              heads * head_dim, stats + (b * heads + h) * length);
    }
  }
  return run_forward(projection_, attended);
}

void CausalSelfAttention::KeySource::keys_of(std::int64_t b, std::int64_t h, std::int64_t head_dim,
                                             bool transpose, std::vector<float>& out) const {
  HeadOperands::copy(keys + b * length * stride, stride, key_column + h * head_step, length,
                     head_dim, transpose, out);
}

void CausalSelfAttention::KeySource::values_of(std::int64_t b, std::int64_t h,
                                               std::int64_t head_dim, bool transpose,
                                               std::vector<float>& out) const {
  HeadOperands::copy(values + b * length * stride, stride, value_column + h * head_step, length,
                     head_dim, transpose, out);
}

CausalSelfAttention::KeySource CausalSelfAttention::key_source() {
  const std::int64_t head_dim = dim_ / heads_;
  const std::int64_t stride = qkv_values_.shape()[2];
  const float* qkv = qkv_values_.values<float>().data();
  if (split_ == nullptr)
    return {qkv,    qkv,      Tensor(),     Tensor(),    qkv_values_.shape()[1],
            stride, head_dim, 2 * head_dim, 3 * head_dim};
  // Every head's keys and values, this rank's rows, then the whole sequence's from the group.
  const std::int64_t batch = qkv_values_.shape()[0];
  const std::int64_t rows = qkv_values_.shape()[1];
  const std::int64_t heads = stride / (3 * head_dim);
  Tensor keys = Tensor::uninitialized(Shape{batch, rows, heads * head_dim}, DType::f32);
  Tensor values = Tensor::uninitialized(keys.shape(), DType::f32);
  for (std::int64_t r = 0; r < batch * rows; ++r) {
    for (std::int64_t h = 0; h < heads; ++h) {
      const float* head = qkv + r * stride + h * 3 * head_dim;
      std::copy_n(head + head_dim, head_dim,
                  keys.values<float>().data() + (r * heads + h) * head_dim);
      std::copy_n(head + 2 * head_dim, head_dim,
                  values.values<float>().data() + (r * heads + h) * head_dim);
    }
  }
  KeySource source;
  source.whole_keys = split_->gather(keys);
  source.whole_values = split_->gather(values);
  source.keys = source.whole_keys.values<float>().data();
  source.values = source.whole_values.values<float>().data();
  source.length = split_->length();
  source.stride = heads * head_dim;
  source.key_column = 0;
  source.value_column = 0;
  source.head_step = head_dim;
  return source;
}

Tensor CausalSelfAttention::backward(const Tensor& grad_output, GradientSink& sink,
                                     bool need_input_grad) {
  if (!qkv_values_.defined()) throw InvalidArgument(describe() + ": backward without a forward");
  const Tensor grad_attended = run_backward(projection_, grad_output, sink, true).contiguous();
  Tensor grad_qkv =
      split_ != nullptr ? split_backward(grad_attended) : whole_backward(grad_attended);
  qkv_values_ = Tensor();
  row_stats_ = Tensor();
  return run_backward(qkv_, grad_qkv, sink, need_input_grad);
}

Tensor CausalSelfAttention::whole_backward(const Tensor& grad_attended) const {
  const ProfileScope profile(ProfileRow::attention);
  const std::int64_t batch = qkv_values_.shape()[0];
  const std::int64_t length = qkv_values_.shape()[1];
  const std::int64_t head_dim = dim_ / heads_;
  const std::int64_t stride = qkv_values_.shape()[2];
  const std::int64_t heads = stride / (3 * head_dim);
  const std::int64_t attended_width = heads * head_dim;
  const std::size_t block = static_cast<std::size_t>(length * head_dim);
  HeadOperands head;
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
      HeadOperands::copy(sequence, stride, query, length, head_dim, false, head.queries);
      HeadOperands::copy(sequence, stride, query + head_dim, length, head_dim, false, head.keys);
      HeadOperands::copy(sequence, stride, query + head_dim, length, head_dim, true, head.keys_t);
      HeadOperands::copy(sequence, stride, query + 2 * head_dim, length, head_dim, true,
                         head.values_t);
      HeadOperands::copy(d_attended + b * length * attended_width, attended_width, h * head_dim,
                         length, head_dim, false, head.grad_output);
      const kernels::HeadGradientInputs in = head.inputs(
          reinterpret_cast<const kernels::RowStats*>(row_stats_.values<float>().data()) +
              (b * heads + h) * length,
          length, head_dim, scale);
      kernels::attention_backward(in, grad_q.data(), grad_k.data(), grad_v.data());
      store_block(grad_q.data(), length, head_dim, d_sequence, stride, query);
      store_block(grad_k.data(), length, head_dim, d_sequence, stride, query + head_dim);
      store_block(grad_v.data(), length, head_dim, d_sequence, stride, query + 2 * head_dim);
    }
  }
  return grad_qkv;
}

Tensor CausalSelfAttention::split_backward(const Tensor& grad_attended) {
  const ProfileScope profile(ProfileRow::attention);
  const std::int64_t batch = qkv_values_.shape()[0];
  const std::int64_t rows = qkv_values_.shape()[1];
  const std::int64_t head_dim = dim_ / heads_;
  const std::int64_t stride = qkv_values_.shape()[2];
  const std::int64_t heads = stride / (3 * head_dim);
  const std::int64_t width = heads * head_dim;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim)));
  const KeySource source = key_source();
  const std::vector<std::int64_t>& positions = split_->positions();
  Tensor grad_qkv = Tensor::uninitialized(qkv_values_.shape(), DType::f32);
  float* d_qkv = grad_qkv.values<float>().data();
  Tensor queries = Tensor::uninitialized(Shape{batch, rows, width}, DType::f32);
  Tensor weighted = Tensor::uninitialized(Shape{batch, heads, rows}, DType::f32);
  HeadOperands head;
  std::vector<float> grad_q(static_cast<std::size_t>(rows * head_dim));
  // The query side of this rank's rows against every key.
  for (std::int64_t b = 0; b < batch; ++b) {
    const float* sequence = qkv_values_.values<float>().data() + b * rows * stride;
    for (std::int64_t h = 0; h < heads; ++h) {
      HeadOperands::copy(sequence, stride, h * 3 * head_dim, rows, head_dim, false, head.queries);
      store_block(head.queries.data(), rows, head_dim,
                  queries.values<float>().data() + b * rows * width, width, h * head_dim);
      HeadOperands::copy(grad_attended.values<float>().data() + b * rows * width, width,
                         h * head_dim, rows, head_dim, false, head.grad_output);
      source.keys_of(b, h, head_dim, true, head.keys_t);
      source.keys_of(b, h, head_dim, false, head.keys);
      source.values_of(b, h, head_dim, true, head.values_t);
      const kernels::HeadGradientInputs in = head.inputs(
          reinterpret_cast<const kernels::RowStats*>(row_stats_.values<float>().data()) +
              (b * heads + h) * rows,
          source.length, head_dim, scale);
      kernels::attention_query_backward(in, positions.data(), rows, grad_q.data(),
                                        weighted.values<float>().data() + (b * heads + h) * rows);
      store_block(grad_q.data(), rows, head_dim, d_qkv + b * rows * stride, stride,
                  h * 3 * head_dim);
    }
  }
  // The key side of this rank's keys against every query row.
  const WholeQuerySide whole =
      gather_query_side(*split_, queries, grad_attended, row_stats_, weighted, heads);
  std::vector<float> grad_k(grad_q.size());
  std::vector<float> grad_v(grad_q.size());
  for (std::int64_t b = 0; b < batch; ++b) {
    for (std::int64_t h = 0; h < heads; ++h) {
      source.keys_of(b, h, head_dim, true, head.keys_t);
      source.values_of(b, h, head_dim, true, head.values_t);
      split_key_backward(*split_, whole, b, h, heads, head_dim, head.keys_t, head.values_t, scale,
                         grad_k.data(), grad_v.data());
      store_block(grad_k.data(), rows, head_dim, d_qkv + b * rows * stride, stride,
                  h * 3 * head_dim + head_dim);
      store_block(grad_v.data(), rows, head_dim, d_qkv + b * rows * stride, stride,
                  h * 3 * head_dim + 2 * head_dim);
    }
  }
  return grad_qkv;
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
