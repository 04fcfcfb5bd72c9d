#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <meshtensor/kernels/rotary.hpp>
#include <meshtensor/nn/decode.hpp>
#include <meshtensor/nn/decoder.hpp>
#include <meshtensor/nn/embedding.hpp>
#include <meshtensor/nn/grouped_attention.hpp>
#include <meshtensor/nn/layers.hpp>

namespace meshtensor::nn {

/// A Llama-family decoder's shape (Llama 2/3, Qwen 2/2.5/3, Mistral, SmolLM, TinyLlama):
/// RMSNorm, rotary embeddings (with transformers' linear or llama3 rescaling), grouped-query
/// attention with heads of any width, a SwiGLU MLP, biases where the family has them (Qwen2's
/// on q, k, v) and (Qwen3) an RMSNorm of each head's queries and keys. The defaults cost about
/// what the default GPT's do (12·dim² a block).
struct LlamaConfig {
  std::int64_t layers = 4;
  std::int64_t heads = 4;
  std::int64_t kv_heads = 2;
  std::int64_t dim = 128;
  std::int64_t ffn = 384;  ///< SwiGLU hidden features
  std::int64_t context = 128;
  std::int64_t vocabulary = 256;
  double rope_theta = 10000.0;
  double norm_eps = 1e-5;
  bool qk_norm = false;       ///< Qwen3's RMSNorm of queries and keys
  bool tie = false;           ///< the head's weight is the token embedding table (transposed)
  std::int64_t head_dim = 0;  ///< values per head (0: dim / heads)
  bool qkv_bias = false;      ///< biases on q, k and v (Qwen2; a Llama's attention_bias)
  bool out_bias = false;      ///< a bias on the attention's output (a Llama's attention_bias)
  bool mlp_bias = false;      ///< biases on the MLP's projections (a Llama's mlp_bias)
  kernels::RotaryScaling rope_scaling;
  std::uint64_t seed = 0;
  double init_std = 0.02;
};

/// Values per head: head_dim, or dim / heads.
std::int64_t llama_head_dim(const LlamaConfig& config);

/// The MLP's blocks (the exact sums' and the tensor-parallel split's units): gcd(ffn, heads),
/// which is the heads when they divide ffn.
std::int64_t llama_mlp_blocks(const LlamaConfig& config);

/// x + attn(norm1(x)), then x + down(SwiGLU(gate_up(norm2(x)))) over f32 [batch, sequence, dim]:
/// RMSNorm, GroupedQueryAttention, and the MLP's gate and up projections as one Linear laid out
/// in llama_mlp_blocks() blocks (each block's gate columns, then its up columns), so a
/// column-parallel split along whole blocks keeps each pair on one rank.
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

/// True for the model texts parse_llama_config reads ("llama", "llama:...").
bool is_llama_model(const std::string& text);

/// Parses "llama" or "llama:layers=L,heads=H,kv_heads=K,dim=D,ffn=F,context=T,rope_theta=R,
/// norm_eps=E,qk_norm=0|1,tie=0|1[,head_dim=N][,qkv_bias=1][,out_bias=1][,mlp_bias=1]
/// [,rope_scaling=linear:F|llama3:F:LOW:HIGH:ORIGINAL]" (any subset of the keys, in any order).
/// ParseError naming the bad part: an unknown or repeated key, a value out of range, K not
/// dividing H, dim not a multiple of H (without head_dim), an odd head dim, a scaling that does
/// not parse.
LlamaConfig parse_llama_config(const std::string& text);

/// The text parse_llama_config reads back: every key of the first line above, then the others
/// where they are not their defaults.
std::string llama_config_text(const LlamaConfig& config);

/// Number of parameters of the model a config builds.
std::int64_t llama_parameter_count(const LlamaConfig& config);

/// The final RMSNorm and the language-model head (no bias): f32 [batch, sequence, dim] ->
/// logits [batch, sequence, vocabulary].
class LlamaHead : public Module {
 public:
  /// With `tied_table` (the token embedding's [vocabulary, dim], which must outlive it) the head's
  /// weight is that table transposed (Linear::tie_weight_to) and the head's only parameter is its
  /// norm's.
  LlamaHead(const LlamaConfig& config, std::uint64_t seed, Parameter* tied_table = nullptr);
  Tensor forward(const Tensor& input) override;
  Tensor backward(const Tensor& grad_output, GradientSink& sink, bool need_input_grad) override;
  std::vector<Parameter*> parameters() override;
  std::string describe() const override;
  /// "norm", "output".
  std::vector<std::pair<std::string, Module*>> children() override;
  /// The input gradient as the exact sum over the vocabulary's products.
  void set_exact_blocks(bool on);
  /// The tied output layer.
  Linear& output() { return output_; }

 private:
  RMSNorm norm_;
  Linear output_;
};

/// The whole Llama-family decoder: i64 tokens [batch, sequence] (sequence at most context) ->
/// f32 logits [batch, sequence, vocabulary]; positions enter through the rotary embeddings of
/// every block's attention. The same units and methods as Gpt: its children are called through
/// run_forward / run_backward, so a sharded runtime can make each one a parameter group.
class Llama : public Decoder {
 public:
  /// The same config gives the same initial bits everywhere.
  explicit Llama(const LlamaConfig& config);
  Tensor forward(const Tensor& tokens) override;
  Tensor backward(const Tensor& grad_output, GradientSink& sink, bool need_input_grad) override;
  std::string describe() const override;
  /// The embedding, every block and the head, in forward order.
  std::vector<Module*> units() override;
  /// "embed", "blocks.0", ..., "head".
  std::vector<std::pair<std::string, Module*>> children() override;
  /// With a tied head: the embedding and the head as one group (they share the table), then
  /// each block; otherwise each unit alone.
  std::vector<std::vector<Module*>> parameter_groups() override;
  /// The config the model was built from.
  const LlamaConfig& config() const { return config_; }
  /// Exact mode's sums over whole groups, heads, MLP blocks and the vocabulary (see
  /// Gpt::set_exact_sums).
  void set_exact_sums(bool on) override;
  void set_sequence_split(SequenceSplit* split) override;
  /// Whether set_exact_sums is on.
  bool exact_sums() const override { return exact_sums_; }
  /// One key/value cache per block for `slots` sequences of the whole context, of the key/value
  /// heads this rank computes (K, not H).
  std::vector<KeyValueCache> make_caches(std::int64_t slots) override;
  /// Incremental forward of the rows `rows` places (as Gpt::decode): each row's logits are the
  /// bits forward() gives that position of its whole sequence.
  Tensor decode(const Tensor& tokens, const DecodeRows& rows,
                std::vector<KeyValueCache>& caches) override;
  std::int64_t context() const override { return config_.context; }
  std::int64_t vocabulary() const override { return config_.vocabulary; }
  std::int64_t layers() const override { return config_.layers; }
  std::int64_t dim() const override { return config_.dim; }
  DecoderConfig decoder_config() const override;
  /// llama_config_text of its config.
  std::string config_text() const override { return llama_config_text(config_); }

 private:
  LlamaConfig config_;
  bool exact_sums_ = false;
  Embedding embedding_;
  std::vector<std::unique_ptr<LlamaBlock>> blocks_;
  LlamaHead head_;
};

}  // namespace meshtensor::nn
