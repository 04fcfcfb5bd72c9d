#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <meshtensor/nn/decoder_spec.hpp>
#include <meshtensor/nn/transformer.hpp>

namespace meshtensor::nn {

/// A GPT-style decoder: token and learned position embeddings, `layers` pre-norm blocks of causal
/// self-attention and a GELU MLP (4·dim hidden), each added to the residual stream, a final
/// LayerNorm and a linear language-model head over the vocabulary.
struct GptConfig {
  std::int64_t layers = 4;
  std::int64_t heads = 4;
  std::int64_t dim = 128;
  std::int64_t context = 128;     ///< longest sequence (positions embedded)
  std::int64_t vocabulary = 256;  ///< tokens (256: the byte tokenizer's)
  /// The head's weight is the token embedding table (transposed) and it has no bias: GPT-2's
  /// own head, so that the model is a Hugging Face GPT2LMHeadModel.
  bool tie = false;
  std::uint64_t seed = 0;
  /// Standard deviation of the initial weights (embeddings and linear layers); the projections
  /// into the residual stream get init_std / sqrt(2 · layers).
  double init_std = 0.02;
  /// gpt_spec of this config: a GPT config stands wherever a spec is asked for.
  operator DecoderSpec() const;  // NOLINT(google-explicit-constructor)
};

/// True for the model texts parse_gpt_config reads ("gpt", "gpt:..."), false for any other
/// model (an MLP's "mlp:...").
bool is_gpt_model(const std::string& text);

/// Parses "gpt" or "gpt:layers=L,heads=H,dim=D,context=T,tie=0|1" (any subset of the keys, in any
/// order; the others keep their defaults). ParseError naming the bad part: an unknown key, a
/// repeated key, a value that is not a positive number or too large, dim not a multiple of heads.
GptConfig parse_gpt_config(const std::string& text);

/// "gpt:layers=4,heads=4,dim=128,context=128" for a config, with ",tie=1" when tied (what
/// parse_gpt_config reads back).
std::string gpt_config_text(const GptConfig& config);

/// The "architecture" metadata of a GPT of `config` reading tokens of `tokenizer` (its name), as
/// `meshtensor train` writes it and parse_architecture() reads it.
std::string architecture_text(const GptConfig& config, const std::string& tokenizer = "bytes");

/// The GPT a checkpoint's "architecture" metadata describes ("gpt layers=L heads=H dim=D
/// context=T vocabulary=V tokenizer=NAME", as `meshtensor train` writes it). DataError naming
/// the text when it is not a GPT's or names no tokenizer (which one it is, is the caller's).
GptConfig parse_architecture(const std::string& text);

/// Number of parameters of the model a config builds.
std::int64_t gpt_parameter_count(const GptConfig& config);

/// Bytes a Gpt of this config allocates when built (its parameters' values and gradients); the
/// constructor refuses (ResourceError) a model that does not fit in memory before allocating.
double gpt_model_bytes(const GptConfig& config);

/// The spec of a GPT: LayerNorm, learned positions, multi-head attention (K = H), a GELU MLP of
/// 4 dim, biases on every projection and on an untied head.
DecoderSpec gpt_spec(const GptConfig& config);

/// The GPT preset of a spec of the gpt family (its five keys, vocabulary, seed and init).
GptConfig gpt_config_of(const DecoderSpec& spec);

/// The decoder of gpt_spec(config), which keeps its GptConfig.
class Gpt : public TransformerDecoder {
 public:
  /// The same config gives the same initial bits everywhere.
  explicit Gpt(const GptConfig& config) : TransformerDecoder(gpt_spec(config)), config_(config) {}
  /// The config the model was built from.
  const GptConfig& config() const { return config_; }

 private:
  GptConfig config_;
};

}  // namespace meshtensor::nn
