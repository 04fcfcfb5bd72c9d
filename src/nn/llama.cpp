#include <algorithm>
#include <cmath>
#include <numeric>

#include <fmt/format.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/core/random.hpp>
#include <meshtensor/nn/llama.hpp>

namespace meshtensor::nn {

namespace {

/// The projections into the residual stream start at init_std / sqrt(2 · layers).
double residual_std(const LlamaConfig& config) {
  return config.init_std / std::sqrt(2.0 * static_cast<double>(config.layers));
}

GroupedAttentionConfig attention_config(const LlamaConfig& c) {
  return {c.dim,      c.heads,    c.kv_heads, c.context,  c.rope_theta,  c.qk_norm,
          c.norm_eps, c.head_dim, c.qkv_bias, c.out_bias, c.rope_scaling};
}

/// The MLP's blocks; InvalidArgument without heads or hidden features.
std::int64_t mlp_blocks(const LlamaConfig& c) {
  if (c.heads < 1 || c.ffn < 1) {
    throw InvalidArgument(
        fmt::format("llama: ffn {} and heads {} must be positive", c.ffn, c.heads));
  }
  return llama_mlp_blocks(c);
}

}  // namespace

std::int64_t llama_head_dim(const LlamaConfig& config) {
  return config.head_dim > 0 ? config.head_dim
                             : config.dim / std::max<std::int64_t>(config.heads, 1);
}

std::int64_t llama_mlp_blocks(const LlamaConfig& config) {
  return std::gcd(config.ffn, config.heads);
}

LlamaBlock::LlamaBlock(const LlamaConfig& config, std::uint64_t seed)
    : blocks_(mlp_blocks(config)),
      norm1_(config.dim, config.norm_eps),
      attention_(attention_config(config), mix64(seed ^ 1), config.init_std, residual_std(config)),
      norm2_(config.dim, config.norm_eps),
      gate_up_(config.dim, 2 * config.ffn, mix64(seed ^ 2), config.init_std, config.mlp_bias),
      swiglu_(config.ffn / blocks_),
      down_(config.ffn, config.dim, mix64(seed ^ 3), residual_std(config), config.mlp_bias) {
  prefix_parameter_names(norm1_, "norm1");
  prefix_parameter_names(attention_, "attn");
  prefix_parameter_names(norm2_, "norm2");
  prefix_parameter_names(gate_up_, "mlp.gate_up");
  prefix_parameter_names(down_, "mlp.down");
}

Tensor LlamaBlock::forward(const Tensor& input) {
  Tensor x = run_forward(attention_, run_forward(norm1_, input));
  add_into(x, input);
  Tensor y =
      run_forward(down_, run_forward(swiglu_, run_forward(gate_up_, run_forward(norm2_, x))));
  add_into(y, x);
  return y;
}

void LlamaBlock::forward_for_backward(const Tensor& input) {
  Tensor x = run_forward(attention_, run_forward(norm1_, input));
  add_into(x, input);
  run_forward_for_backward(down_,
                           run_forward(swiglu_, run_forward(gate_up_, run_forward(norm2_, x))));
}

Tensor LlamaBlock::backward(const Tensor& grad_output, GradientSink& sink, bool need_input_grad) {
  const Tensor dy = grad_output.contiguous();
  const Tensor d_hidden = run_backward(swiglu_, run_backward(down_, dy, sink, true), sink, true);
  Tensor dx = run_backward(norm2_, run_backward(gate_up_, d_hidden, sink, true), sink, true);
  add_into(dx, dy);
  Tensor d_input =
      run_backward(norm1_, run_backward(attention_, dx, sink, true), sink, need_input_grad);
  if (!need_input_grad) return {};
  add_into(d_input, dx);
  return d_input;
}

std::vector<Parameter*> LlamaBlock::parameters() {
  return parameters_of({&norm1_, &attention_, &norm2_, &gate_up_, &down_});
}

std::vector<std::pair<std::string, Module*>> LlamaBlock::children() {
  return {{"norm1", &norm1_},         {"attn", &attention_}, {"norm2", &norm2_},
          {"mlp.gate_up", &gate_up_}, {"mlp.act", &swiglu_}, {"mlp.down", &down_}};
}

void LlamaBlock::set_exact_blocks(bool on) {
  attention_.set_exact_blocks(on);
  gate_up_.set_exact_blocks(0, on ? blocks_ : 0);
  down_.set_exact_blocks(on ? blocks_ : 0, 0);
}

std::string LlamaBlock::describe() const {
  return fmt::format("LlamaBlock({}, SwiGLU)", attention_.describe());
}

}  // namespace meshtensor::nn
