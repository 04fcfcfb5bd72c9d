#include <algorithm>
#include <cmath>
#include <utility>

#include <fmt/format.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/core/profile.hpp>
#include <meshtensor/core/random.hpp>
#include <meshtensor/kernels/attention.hpp>
#include <meshtensor/nn/grouped_attention.hpp>

#include "split_attention.hpp"

namespace meshtensor::nn {

namespace {

/// Head h's `length` rows from row `first` of the queries and the attention's output gradient
/// (both [rows, heads·hd]) into `head`'s queries and grad_output.
void copy_query_rows(const Tensor& queries, const Tensor& grad_attended, std::int64_t first,
                     std::int64_t h, std::int64_t length, std::int64_t hd, HeadOperands& head) {
  const std::int64_t width = queries.shape()[queries.rank() - 1];
  HeadOperands::copy(queries.values<float>().data() + first * width, width, h * hd, length, hd,
                     false, head.queries);
  HeadOperands::copy(grad_attended.values<float>().data() + first * width, width, h * hd, length,
                     hd, false, head.grad_output);
}

/// Writes (or, with `add`, adds) [length, width] `block` into columns [column, column + width)
/// of a row-major matrix with `stride` columns.
void scatter_columns(const float* block, std::int64_t length, std::int64_t width, float* matrix,
                     std::int64_t stride, std::int64_t column, bool add) {
  for (std::int64_t i = 0; i < length; ++i) {
    float* row = matrix + i * stride + column;
    for (std::int64_t d = 0; d < width; ++d)
      row[d] = add ? row[d] + block[i * width + d] : block[i * width + d];
  }
}

void check_config(const GroupedAttentionConfig& c) {
  if (c.heads < 1 || c.kv_heads < 1 || c.heads % c.kv_heads != 0) {
    throw InvalidArgument(fmt::format(
        "attention: {} key/value heads do not divide the {} query heads", c.kv_heads, c.heads));
  }
  if (c.dim < 1 || c.head_dim < 0 || (c.head_dim == 0 && c.dim % c.heads != 0))
    throw InvalidArgument(
        fmt::format("attention: dim {} does not split into {} heads", c.dim, c.heads));
  if (c.rotary && attention_head_dim(c) % 2 != 0) {
    throw InvalidArgument(fmt::format(
        "attention: the head dim {} must be even for rotary embeddings", attention_head_dim(c)));
  }
  if (c.context < 1)
    throw InvalidArgument(fmt::format("attention: context {} is below 1", c.context));
}

}  // namespace

std::int64_t attention_head_dim(const GroupedAttentionConfig& config) {
  return config.head_dim > 0 ? config.head_dim
                             : config.dim / std::max<std::int64_t>(config.heads, 1);
}

GroupedQueryAttention::GroupedQueryAttention(const GroupedAttentionConfig& config,
                                             std::uint64_t seed, double init_std,
                                             double projection_std)
    : config_((check_config(config), config)),
      rotary_(config.rotary
                  ? kernels::shared_rotary_table(attention_head_dim(config), config.context,
                                                 config.rope_theta, config.rope_scaling)
                  : nullptr),
      qkv_(config.dim, (config.heads + 2 * config.kv_heads) * attention_head_dim(config),
           mix64(seed ^ 0x716b76ULL), init_std, config.qkv_bias),
      projection_(config.heads * attention_head_dim(config), config.dim,
                  mix64(seed ^ 0x70726f6aULL), projection_std, config.out_bias) {
  prefix_parameter_names(qkv_, "qkv");
  prefix_parameter_names(projection_, "proj");
  if (config.qk_norm) {
    q_norm_ = std::make_unique<RMSNorm>(head_dim(), config.norm_eps);
    k_norm_ = std::make_unique<RMSNorm>(head_dim(), config.norm_eps);
    prefix_parameter_names(*q_norm_, "q_norm");
    prefix_parameter_names(*k_norm_, "k_norm");
  }
}

std::vector<Parameter*> GroupedQueryAttention::parameters() {
  std::vector<Parameter*> all = qkv_.parameters();
  if (q_norm_) all.insert(all.end(), {q_norm_->parameters()[0], k_norm_->parameters()[0]});
  for (Parameter* p : projection_.parameters())
    all.push_back(p);
  return all;
}

std::string GroupedQueryAttention::describe() const {
  return fmt::format("GroupedQueryAttention({}, heads={}, kv_heads={}{}{}{}{})", config_.dim,
                     config_.heads, config_.kv_heads,
                     config_.head_dim > 0 ? fmt::format(", head_dim={}", head_dim()) : "",
                     config_.qk_norm ? ", qk_norm" : "", config_.qkv_bias ? ", qkv_bias" : "",
                     config_.out_bias ? ", out_bias" : "");
}

std::vector<std::pair<std::string, Module*>> GroupedQueryAttention::children() {
  std::vector<std::pair<std::string, Module*>> all = {{"qkv", &qkv_}};
  if (q_norm_) all.insert(all.end(), {{"q_norm", q_norm_.get()}, {"k_norm", k_norm_.get()}});
  all.emplace_back("proj", &projection_);
  return all;
}

std::int64_t GroupedQueryAttention::local_groups() const {
  return qkv_.weight().value.shape()[1] / ((group_size() + 2) * head_dim());
}

void GroupedQueryAttention::set_exact_blocks(bool on) {
  qkv_.set_exact_blocks(0, on ? config_.kv_heads : 0);
  projection_.set_exact_blocks(on ? config_.heads : 0, 0);
}

GroupedQueryAttention::Heads GroupedQueryAttention::prepare_heads(
    const Tensor& qkv, const std::vector<std::int64_t>& positions) {
  const std::int64_t hd = head_dim();
  const std::int64_t group = group_size();
  const std::int64_t groups = local_groups();
  const auto rows = static_cast<std::int64_t>(positions.size());
  const std::int64_t stride = groups * (group + 2) * hd;
  Heads heads{Tensor::uninitialized(Shape{rows, groups * group * hd}, DType::f32),
              Tensor::uninitialized(Shape{rows, groups * hd}, DType::f32),
              Tensor::uninitialized(Shape{rows, groups * hd}, DType::f32)};
  const float* in = qkv.values<float>().data();
  float* q = heads.queries.values<float>().data();
  float* k = heads.keys.values<float>().data();
  float* v = heads.values.values<float>().data();
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* row = in + r * stride;
    for (std::int64_t g = 0; g < groups; ++g) {
      const float* source = row + g * (group + 2) * hd;
      std::copy_n(source, group * hd, q + (r * groups + g) * group * hd);
      std::copy_n(source + group * hd, hd, k + (r * groups + g) * hd);
      std::copy_n(source + (group + 1) * hd, hd, v + (r * groups + g) * hd);
    }
  }
  if (q_norm_) {
    heads.queries = run_forward(*q_norm_, heads.queries.reshape(Shape{rows * groups * group, hd}))
                        .reshape(heads.queries.shape());
    heads.keys = run_forward(*k_norm_, heads.keys.reshape(Shape{rows * groups, hd}))
                     .reshape(heads.keys.shape());
  }
  if (rotary_) {
    kernels::rotary_forward(heads.queries.values<float>().data(), rows, groups * group,
                            positions.data(), *rotary_);
    kernels::rotary_forward(heads.keys.values<float>().data(), rows, groups, positions.data(),
                            *rotary_);
  }
  return heads;
}

std::pair<Tensor, Tensor> GroupedQueryAttention::whole_keys(std::int64_t batch,
                                                            std::int64_t length) {
  const std::int64_t width = keys_.shape()[1];
  const Tensor keys = keys_.reshape(Shape{batch, length, width});
  const Tensor values = values_.reshape(Shape{batch, length, width});
  if (split_ == nullptr) return {keys, values};
  return {split_->gather(keys), split_->gather(values)};
}

Tensor GroupedQueryAttention::attend(std::int64_t batch, std::int64_t length) {
  const ProfileScope profile(ProfileRow::attention);
  const std::int64_t hd = head_dim();
  const std::int64_t group = group_size();
  const std::int64_t groups = local_groups();
  const std::int64_t heads = groups * group;
  const auto [keys, values] = whole_keys(batch, length);
  const std::int64_t whole = keys.shape()[1];
  const std::vector<std::int64_t> positions = row_positions(split_, 1, length);
  row_stats_ = Tensor::uninitialized(Shape{batch, heads, length, 2}, DType::f32);
  Tensor attended = Tensor::uninitialized(Shape{batch, length, heads * hd}, DType::f32);
  std::vector<float> keys_t;
  std::vector<float> head_values;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
  const float* q = queries_.values<float>().data();
  auto* stats = reinterpret_cast<kernels::RowStats*>(row_stats_.values<float>().data());
  float* out = attended.values<float>().data();
  for (std::int64_t b = 0; b < batch; ++b) {
    for (std::int64_t g = 0; g < groups; ++g) {
      const std::int64_t first = b * length;
      HeadOperands::copy(keys.values<float>().data() + b * whole * groups * hd, groups * hd, g * hd,
                         whole, hd, true, keys_t);
      HeadOperands::copy(values.values<float>().data() + b * whole * groups * hd, groups * hd,
                         g * hd, whole, hd, false, head_values);
      const kernels::HeadCache cache{keys_t.data(), head_values.data(), whole, hd};
      for (std::int64_t h = g * group; h < (g + 1) * group; ++h) {
        kernels::attention_rows(q + first * heads * hd + h * hd, heads * hd, positions.data(),
                                length, cache, scale, out + first * heads * hd + h * hd, heads * hd,
                                stats + (b * heads + h) * length);
      }
    }
  }
  return attended;
}

void GroupedQueryAttention::split_attend_backward(const Tensor& grad_attended, std::int64_t batch,
                                                  std::int64_t length, Tensor& grad_q,
                                                  Tensor& grad_k, Tensor& grad_v) {
  const ProfileScope profile(ProfileRow::attention);
  const std::int64_t hd = head_dim();
  const std::int64_t group = group_size();
  const std::int64_t groups = local_groups();
  const std::int64_t heads = groups * group;
  const auto [keys, values] = whole_keys(batch, length);
  const std::int64_t whole = keys.shape()[1];
  const std::vector<std::int64_t>& positions = split_->positions();
  grad_q = Tensor::uninitialized(queries_.shape(), DType::f32);
  grad_k = Tensor::uninitialized(keys_.shape(), DType::f32);
  grad_v = Tensor::uninitialized(values_.shape(), DType::f32);
  Tensor weighted = Tensor::uninitialized(Shape{batch, heads, length}, DType::f32);
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
  HeadOperands head;
  std::vector<float> head_dq(static_cast<std::size_t>(length * hd));
  const auto group_operands = [&](std::int64_t b, std::int64_t g) {
    const float* k = keys.values<float>().data() + b * whole * groups * hd;
    HeadOperands::copy(k, groups * hd, g * hd, whole, hd, false, head.keys);
    HeadOperands::copy(k, groups * hd, g * hd, whole, hd, true, head.keys_t);
    HeadOperands::copy(values.values<float>().data() + b * whole * groups * hd, groups * hd, g * hd,
                       whole, hd, true, head.values_t);
  };
  for (std::int64_t b = 0; b < batch; ++b) {
    const std::int64_t first = b * length;
    for (std::int64_t g = 0; g < groups; ++g) {
      group_operands(b, g);
      for (std::int64_t h = g * group; h < (g + 1) * group; ++h) {
        copy_query_rows(queries_, grad_attended, first, h, length, hd, head);
        const kernels::HeadGradientInputs in = head.inputs(
            reinterpret_cast<const kernels::RowStats*>(row_stats_.values<float>().data()) +
                (b * heads + h) * length,
            whole, hd, scale);
        kernels::attention_query_backward(
            in, positions.data(), length, head_dq.data(),
            weighted.values<float>().data() + (b * heads + h) * length);
        scatter_columns(head_dq.data(), length, hd,
                        grad_q.values<float>().data() + first * heads * hd, heads * hd, h * hd,
                        false);
      }
    }
  }
  const WholeQuerySide whole_side = gather_query_side(
      *split_, queries_.reshape(Shape{batch, length, heads * hd}),
      grad_attended.reshape(Shape{batch, length, heads * hd}), row_stats_, weighted, heads);
  std::vector<float> head_dk(head_dq.size());
  std::vector<float> head_dv(head_dq.size());
  for (std::int64_t b = 0; b < batch; ++b) {
    const std::int64_t first = b * length;
    for (std::int64_t g = 0; g < groups; ++g) {
      group_operands(b, g);
      for (std::int64_t h = g * group; h < (g + 1) * group; ++h) {
        split_key_backward(*split_, whole_side, b, h, heads, hd, head.keys_t, head.values_t, scale,
                           head_dk.data(), head_dv.data());
        // The group's query heads add into its key and value in ascending order.
        const bool first_of_group = h == g * group;
        scatter_columns(head_dk.data(), length, hd,
                        grad_k.values<float>().data() + first * groups * hd, groups * hd, g * hd,
                        !first_of_group);
        scatter_columns(head_dv.data(), length, hd,
                        grad_v.values<float>().data() + first * groups * hd, groups * hd, g * hd,
                        !first_of_group);
      }
    }
  }
}

void GroupedQueryAttention::set_decode(const DecodeRows* rows, KeyValueCache* cache) {
  if (rows != nullptr && (cache == nullptr || cache->heads() != local_groups() ||
                          cache->head_dim() != head_dim() || cache->context() > config_.context)) {
    throw InvalidArgument(
        fmt::format("{}: decoding needs a cache of {} key/value heads of {} values, of at most {} "
                    "positions",
                    describe(), local_groups(), head_dim(), config_.context));
  }
  decode_rows_ = rows;
  cache_ = rows != nullptr ? cache : nullptr;
}

Tensor GroupedQueryAttention::forward_decode(const Tensor& input) {
  const DecodeRows& rows = *decode_rows_;
  if (input.shape()[0] != 1 || input.shape()[1] != rows.size()) {
    throw InvalidArgument(fmt::format("{}: decoding takes [1, {}, {}], got {}", describe(),
                                      rows.size(), config_.dim, input.shape().to_string()));
  }
  const Tensor qkv = run_forward(qkv_, input);
  const Heads heads =
      prepare_heads(qkv.reshape(Shape{rows.size(), qkv.shape()[2]}), rows.positions);
  const std::int64_t hd = head_dim();
  const std::int64_t group = group_size();
  const std::int64_t groups = local_groups();
  check_cache_rows(rows, *cache_);
  // Every row's keys and values first: rows of one slot see the earlier rows of this call.
  for (std::int64_t r = 0; r < rows.size(); ++r) {
    const std::int64_t slot = rows.slots[static_cast<std::size_t>(r)];
    const std::int64_t position = rows.positions[static_cast<std::size_t>(r)];
    const std::int64_t context = cache_->capacity(slot);
    for (std::int64_t g = 0; g < groups; ++g) {
      const float* key = heads.keys.values<float>().data() + (r * groups + g) * hd;
      float* keys_t = cache_->keys_t(slot, g);
      for (std::int64_t d = 0; d < hd; ++d)
        keys_t[d * context + position] = key[d];
      std::copy_n(heads.values.values<float>().data() + (r * groups + g) * hd, hd,
                  cache_->values(slot, g) + position * hd);
    }
  }
  Tensor attended = Tensor::uninitialized(Shape{1, rows.size(), groups * group * hd}, DType::f32);
  std::vector<float> probabilities(static_cast<std::size_t>(cache_->context()));
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
  const float* q = heads.queries.values<float>().data();
  float* out = attended.values<float>().data();
  for (std::int64_t r = 0; r < rows.size(); ++r) {
    const std::int64_t slot = rows.slots[static_cast<std::size_t>(r)];
    const std::int64_t position = rows.positions[static_cast<std::size_t>(r)];
    for (std::int64_t h = 0; h < groups * group; ++h) {
      const kernels::HeadCache cache{cache_->keys_t(slot, h / group),
                                     cache_->values(slot, h / group), cache_->capacity(slot), hd};
      kernels::attention_row(q + (r * groups * group + h) * hd, cache, position + 1, scale,
                             probabilities.data(), out + (r * groups * group + h) * hd);
    }
  }
  return run_forward(projection_, attended);
}

Tensor GroupedQueryAttention::forward(const Tensor& input) {
  if (!input.defined() || input.rank() != 3 || input.dtype() != DType::f32 ||
      input.shape()[2] != config_.dim) {
    throw InvalidArgument(fmt::format("{} needs f32 [batch, sequence, {}], got {}", describe(),
                                      config_.dim,
                                      input.defined() ? input.shape().to_string() : "none"));
  }
  if (decode_rows_ != nullptr) return forward_decode(input);
  // qkv's output has the whole sequence, also when the input is a sequence shard.
  const Tensor qkv = run_forward(qkv_, input);
  const std::int64_t batch = qkv.shape()[0];
  const std::int64_t length = qkv.shape()[1];
  const std::int64_t whole = split_ != nullptr ? split_->length() : length;
  if (whole > config_.context) {
    throw InvalidArgument(fmt::format("{}: a sequence of {} is longer than the context {}",
                                      describe(), whole, config_.context));
  }
  Heads heads = prepare_heads(qkv.reshape(Shape{batch * length, qkv.shape()[2]}),
                              row_positions(split_, batch, length));
  queries_ = std::move(heads.queries);
  keys_ = std::move(heads.keys);
  values_ = std::move(heads.values);
  return run_forward(projection_, attend(batch, length));
}

void GroupedQueryAttention::attend_backward(const Tensor& grad_attended, std::int64_t batch,
                                            std::int64_t length, Tensor& grad_q, Tensor& grad_k,
                                            Tensor& grad_v) const {
  const ProfileScope profile(ProfileRow::attention);
  const std::int64_t hd = head_dim();
  const std::int64_t group = group_size();
  const std::int64_t groups = local_groups();
  const std::int64_t heads = groups * group;
  const auto block = static_cast<std::size_t>(length * hd);
  HeadOperands head;
  std::vector<float> head_q(block), head_k(block), head_v(block);
  grad_q = Tensor::uninitialized(queries_.shape(), DType::f32);
  grad_k = Tensor::uninitialized(keys_.shape(), DType::f32);
  grad_v = Tensor::uninitialized(values_.shape(), DType::f32);
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
  for (std::int64_t b = 0; b < batch; ++b) {
    const std::int64_t first = b * length;
    for (std::int64_t g = 0; g < groups; ++g) {
      const float* group_keys = keys_.values<float>().data() + first * groups * hd;
      HeadOperands::copy(group_keys, groups * hd, g * hd, length, hd, false, head.keys);
      HeadOperands::copy(group_keys, groups * hd, g * hd, length, hd, true, head.keys_t);
      HeadOperands::copy(values_.values<float>().data() + first * groups * hd, groups * hd, g * hd,
                         length, hd, true, head.values_t);
      for (std::int64_t h = g * group; h < (g + 1) * group; ++h) {
        copy_query_rows(queries_, grad_attended, first, h, length, hd, head);
        const kernels::HeadGradientInputs in = head.inputs(
            reinterpret_cast<const kernels::RowStats*>(row_stats_.values<float>().data()) +
                (b * heads + h) * length,
            length, hd, scale);
        kernels::attention_backward(in, head_q.data(), head_k.data(), head_v.data());
        const bool first_of_group = h == g * group;
        scatter_columns(head_q.data(), length, hd,
                        grad_q.values<float>().data() + first * heads * hd, heads * hd, h * hd,
                        false);
        // The group's query heads add into its key and value in ascending order.
        scatter_columns(head_k.data(), length, hd,
                        grad_k.values<float>().data() + first * groups * hd, groups * hd, g * hd,
                        !first_of_group);
        scatter_columns(head_v.data(), length, hd,
                        grad_v.values<float>().data() + first * groups * hd, groups * hd, g * hd,
                        !first_of_group);
      }
    }
  }
}

Tensor GroupedQueryAttention::merge_heads(Tensor& grad_q, Tensor& grad_k, const Tensor& grad_v,
                                          GradientSink& sink, std::int64_t batch,
                                          std::int64_t length) {
  const std::int64_t hd = head_dim();
  const std::int64_t group = group_size();
  const std::int64_t groups = local_groups();
  const std::int64_t rows = batch * length;
  if (rotary_) {
    const std::vector<std::int64_t> positions = row_positions(split_, batch, length);
    kernels::rotary_backward(grad_q.values<float>().data(), rows, groups * group, positions.data(),
                             *rotary_);
    kernels::rotary_backward(grad_k.values<float>().data(), rows, groups, positions.data(),
                             *rotary_);
  }
  if (q_norm_) {
    grad_q = run_backward(*q_norm_, grad_q.reshape(Shape{rows * groups * group, hd}), sink, true)
                 .reshape(grad_q.shape());
    grad_k = run_backward(*k_norm_, grad_k.reshape(Shape{rows * groups, hd}), sink, true)
                 .reshape(grad_k.shape());
  }
  const std::int64_t stride = groups * (group + 2) * hd;
  Tensor grad_qkv = Tensor::uninitialized(Shape{batch, length, stride}, DType::f32);
  float* out = grad_qkv.values<float>().data();
  const float* dq = grad_q.values<float>().data();
  const float* dk = grad_k.values<float>().data();
  const float* dv = grad_v.values<float>().data();
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t g = 0; g < groups; ++g) {
      float* target = out + r * stride + g * (group + 2) * hd;
      std::copy_n(dq + (r * groups + g) * group * hd, group * hd, target);
      std::copy_n(dk + (r * groups + g) * hd, hd, target + group * hd);
      std::copy_n(dv + (r * groups + g) * hd, hd, target + (group + 1) * hd);
    }
  }
  return grad_qkv;
}

Tensor GroupedQueryAttention::backward(const Tensor& grad_output, GradientSink& sink,
                                       bool need_input_grad) {
  if (!row_stats_.defined()) throw InvalidArgument(describe() + ": backward without a forward");
  const std::int64_t batch = row_stats_.shape()[0];
  const std::int64_t length = row_stats_.shape()[2];
  const Tensor grad_attended = run_backward(projection_, grad_output, sink, true).contiguous();
  Tensor grad_q;
  Tensor grad_k;
  Tensor grad_v;
  if (split_ != nullptr) {
    split_attend_backward(grad_attended, batch, length, grad_q, grad_k, grad_v);
  } else {
    attend_backward(grad_attended, batch, length, grad_q, grad_k, grad_v);
  }
  const Tensor grad_qkv = merge_heads(grad_q, grad_k, grad_v, sink, batch, length);
  queries_ = Tensor();
  keys_ = Tensor();
  values_ = Tensor();
  row_stats_ = Tensor();
  return run_backward(qkv_, grad_qkv, sink, need_input_grad);
}

SavedState GroupedQueryAttention::take_saved() {
  SavedState saved;
  for (Tensor* kept : {&queries_, &keys_, &values_, &row_stats_})
    saved.tensors.push_back(std::exchange(*kept, Tensor()));
  return saved;
}

void GroupedQueryAttention::restore_saved(SavedState saved) {
  queries_ = std::move(saved.tensors.at(0));
  keys_ = std::move(saved.tensors.at(1));
  values_ = std::move(saved.tensors.at(2));
  row_stats_ = std::move(saved.tensors.at(3));
}

}  // namespace meshtensor::nn
