#pragma once

#include <cstdint>

#include <meshtensor/nn/grouped_attention.hpp>
#include <meshtensor/nn/layers.hpp>

namespace meshtensor::nn {

/// A Llama-family decoder's shape (Llama 3, Qwen 2/3, Mistral): RMSNorm, rotary embeddings,
/// grouped-query attention, a SwiGLU MLP, no biases, an optionally tied head and (Qwen3) an
/// RMSNorm of each head's queries and keys.
struct LlamaConfig {
  std::int64_t layers = 4;
  std::int64_t heads = 4;
  std::int64_t kv_heads = 2;
  std::int64_t dim = 128;
  std::int64_t ffn = 384;  ///< SwiGLU hidden features (a multiple of heads)
  std::int64_t context = 128;
  std::int64_t vocabulary = 256;
  double rope_theta = 10000.0;
  double norm_eps = 1e-5;
  bool tie = false;      ///< the head uses the token embedding's table
  bool qk_norm = false;  ///< Qwen3's RMSNorm of queries and keys
  std::uint64_t seed = 0;
  double init_std = 0.02;
};

/// x + attn(norm1(x)), then x + down(SwiGLU(gate_up(norm2(x)))) over f32 [batch, sequence, dim]:
/// RMSNorm, GroupedQueryAttention, and the MLP's gate and up projections as one Linear laid out
/// in `heads` blocks (each block's gate columns, then its up columns), so a column-parallel split
/// along whole heads keeps each pair on one rank. No biases.
class LlamaBlock : public Module {
 public:
  LlamaBlock(const LlamaConfig& config, std::uint64_t seed);
  Tensor forward(const Tensor& input) override;
  Tensor backward(const Tensor& grad_output, GradientSink& sink, bool need_input_grad) override;
  /// Forward up to the MLP's down projection, which only keeps its input.
  void forward_for_backward(const Tensor& input) override;
  std::vector<Parameter*> parameters() override;
  std::string describe() const override;
  /// "norm1", "attn", "norm2", "mlp.gate_up", "mlp.act", "mlp.down".
  std::vector<std::pair<std::string, Module*>> children() override;
  /// Exact sums over whole groups, heads and MLP blocks (GroupedQueryAttention::set_exact_blocks,
  /// Linear::set_exact_blocks).
  void set_exact_blocks(bool on);
  /// The attention layer.
  GroupedQueryAttention& attention() { return attention_; }

 private:
  std::int64_t blocks_;
  RMSNorm norm1_;
  GroupedQueryAttention attention_;
  RMSNorm norm2_;
  Linear gate_up_;
  SwiGLU swiglu_;
  Linear down_;
};

}  // namespace meshtensor::nn
