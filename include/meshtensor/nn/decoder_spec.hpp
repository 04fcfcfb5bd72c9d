#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include <meshtensor/kernels/rotary.hpp>

namespace meshtensor::nn {

/// The normalisation before each sub-layer and before the head.
enum class NormKind {
  layer_norm,  ///< LayerNorm: a weight and a bias
  rms_norm,    ///< RMSNorm: a weight
};

/// How positions enter the model.
enum class PositionKind {
  learned,  ///< a learned table of `context` rows added to the token embedding (GPT-2)
  rotary,   ///< rotary embeddings of each head's queries and keys (Llama)
};

/// The MLP of every block.
enum class MlpKind {
  gelu,    ///< Linear(dim, ffn), GELU's tanh form, Linear(ffn, dim)
  swiglu,  ///< one gate/up Linear(dim, 2 ffn) in blocks, SwiGLU, Linear(ffn, dim)
};

/// The model texts a spec reads and writes as: a family is a preset of the spec, the keys its
/// text exposes over fixed values of the rest (decoder_spec_text, parse_decoder_spec).
enum class DecoderFamily {
  gpt,    ///< "gpt:layers=,heads=,dim=,context=,tie=": LayerNorm, learned positions, GELU,
          ///< biases everywhere, K = H, ffn = 4 dim
  llama,  ///< "llama:...": every other key of the spec
};

/// One decoder-only transformer, described: what every family (GPT-2, Llama 2/3, Qwen 2/2.5/3,
/// Mistral, SmolLM, TinyLlama) sets, from which the model, its parameter count and memory, its
/// key/value caches, its tensor-parallel plan and its Hugging Face tensors derive. The defaults
/// are the default Llama (about what the default GPT costs: 12 dim^2 a block); gpt_spec() gives
/// a GPT's. Ranges: decoder_spec_problem.
struct DecoderSpec {
  std::int64_t layers = 4;
  std::int64_t heads = 4;     ///< query heads H
  std::int64_t kv_heads = 2;  ///< key/value heads K (K divides H; K = H is multi-head)
  std::int64_t dim = 128;     ///< features of the residual stream
  std::int64_t ffn = 384;     ///< the MLP's hidden features
  std::int64_t context = 128;
  std::int64_t vocabulary = 256;
  double rope_theta = 10000.0;
  double norm_eps = 1e-5;
  bool qk_norm = false;       ///< Qwen3's RMSNorm of each head's queries and keys
  bool tie = false;           ///< the head's weight is the token embedding table (transposed)
  std::int64_t head_dim = 0;  ///< values per head (0: dim / heads)
  bool qkv_bias = false;      ///< biases on q, k and v (Qwen2; a Llama's attention_bias)
  bool out_bias = false;      ///< a bias on the attention's output (a Llama's attention_bias)
  bool mlp_bias = false;      ///< biases on the MLP's projections (a Llama's mlp_bias)
  kernels::RotaryScaling rope_scaling;
  std::uint64_t seed = 0;
  /// Standard deviation of the initial weights; the projections into the residual stream get
  /// init_std / sqrt(2 · layers).
  double init_std = 0.02;
  NormKind norm = NormKind::rms_norm;
  PositionKind positions = PositionKind::rotary;
  MlpKind mlp = MlpKind::swiglu;
  bool head_bias = false;  ///< a bias on an untied head (GPT's)
  DecoderFamily family = DecoderFamily::llama;
  bool operator==(const DecoderSpec&) const = default;
};

/// Values per head: head_dim, or dim / heads.
std::int64_t decoder_head_dim(const DecoderSpec& spec);

/// The MLP's blocks (the exact sums' and the tensor-parallel split's units): gcd(ffn, heads),
/// which is the heads when they divide ffn.
std::int64_t decoder_mlp_blocks(const DecoderSpec& spec);

/// Columns of the attention's fused q/k/v projection: (H + 2K) · head_dim.
std::int64_t decoder_qkv_width(const DecoderSpec& spec);

/// Parameters of one block.
std::int64_t decoder_block_parameters(const DecoderSpec& spec);

/// Parameters of the model a spec builds.
std::int64_t decoder_parameter_count(const DecoderSpec& spec);

/// What is wrong with a spec's shape (a count below 1, K not dividing H, dim not a multiple of
/// H without a head_dim, an odd head dim under rotary embeddings), or empty.
std::string decoder_spec_problem(const DecoderSpec& spec);

/// The integer field of `spec` a model text's key names ("layers", "heads", "kv_heads", "dim",
/// "ffn", "context", "head_dim"), or null for another key.
std::int64_t* decoder_integer_key(DecoderSpec& spec, std::string_view key);

/// The largest value an integer key may take, from 1 (the spec's ranges: 256 layers, heads and
/// kv_heads; dim 8192; ffn 65536; context 2^20; head_dim 1024); 0 for another key.
std::int64_t decoder_key_limit(std::string_view key);

/// "gpt" or "llama".
std::string decoder_family_name(const DecoderSpec& spec);

/// Child names of the block's two MLP projections: "mlp.fc" and "mlp.proj" (GELU), or
/// "mlp.gate_up" and "mlp.down" (SwiGLU).
std::pair<std::string, std::string> mlp_projection_names(const DecoderSpec& spec);

}  // namespace meshtensor::nn
