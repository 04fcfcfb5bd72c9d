#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <meshtensor/nn/attention.hpp>
#include <meshtensor/nn/decoder.hpp>
#include <meshtensor/nn/embedding.hpp>
#include <meshtensor/nn/layers.hpp>

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

/// x + attention(norm1(x)), then x + mlp(norm2(x)) (mlp: Linear(dim, 4 dim), GELU,
/// Linear(4 dim, dim)), over f32 [batch, sequence, dim].
class TransformerBlock : public Module {
 public:
  TransformerBlock(const GptConfig& config, std::uint64_t seed);
  Tensor forward(const Tensor& input) override;
  Tensor backward(const Tensor& grad_output, GradientSink& sink, bool need_input_grad) override;
  /// Forward up to the MLP's last projection, which only keeps its input: the block's output
  /// (that projection's product, its communication and the residual) is what backward never
  /// reads.
  void forward_for_backward(const Tensor& input) override;
  std::vector<Parameter*> parameters() override;
  std::string describe() const override;
  /// "norm1", "attn", "norm2", "mlp.fc", "mlp.act", "mlp.proj".
  std::vector<std::pair<std::string, Module*>> children() override;
  /// Exact sums over whole heads in the attention and over heads-many blocks of the MLP's hidden
  /// features (see Gpt::set_exact_sums).
  void set_exact_blocks(bool on);
  /// The attention layer.
  CausalSelfAttention& attention() { return attention_; }

 private:
  LayerNorm norm1_;
  CausalSelfAttention attention_;
  LayerNorm norm2_;
  Linear fc_;
  GELU gelu_;
  Linear projection_;
};

/// Final LayerNorm and the language-model head: f32 [batch, sequence, dim] -> logits [batch,
/// sequence, vocabulary].
class LanguageModelHead : public Module {
 public:
  /// With `tied_table` (the token embedding's [vocabulary, dim], which must outlive it) the
  /// output's weight is that table transposed and it has no bias (config.tie).
  LanguageModelHead(const GptConfig& config, std::uint64_t seed, Parameter* tied_table = nullptr);
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
  LayerNorm norm_;
  Linear output_;
};

/// The whole decoder: i64 tokens [batch, sequence] (sequence at most context) -> f32 logits
/// [batch, sequence, vocabulary]; the logits of position t depend on tokens 0..t of their own
/// sequence only. Its children (units()) are called through run_forward / run_backward, so a
/// sharded runtime can make each one a parameter group.
class Gpt : public Decoder {
 public:
  /// The same config gives the same initial bits everywhere.
  explicit Gpt(const GptConfig& config);
  Tensor forward(const Tensor& tokens) override;
  Tensor backward(const Tensor& grad_output, GradientSink& sink, bool need_input_grad) override;
  std::string describe() const override;
  /// The embedding, every block and the head, in forward order: the natural parameter groups.
  std::vector<Module*> units() override;
  /// With a tied head: the embedding and the head as one group (they share the table), then
  /// each block.
  std::vector<std::vector<Module*>> parameter_groups() override;
  /// The config the model was built from.
  const GptConfig& config() const { return config_; }
  /// "embed", "blocks.0", ..., "head".
  std::vector<std::pair<std::string, Module*>> children() override;
  /// Exact mode's sums, whose bits do not depend on the tensor-parallel degree: every sum that a
  /// tensor-parallel split divides among ranks is the correctly rounded sum of terms fixed by
  /// the model alone. Attention output projection: one f32 partial product per head; MLP output
  /// projection: one per heads-many equal blocks of the hidden features; the input gradients of
  /// qkv and the MLP's first layer: likewise per head and block; the LM head's input gradient:
  /// the exact sum of its products over the vocabulary. Off: ordered f32 products throughout.
  void set_exact_sums(bool on) override;
  void set_sequence_split(SequenceSplit* split) override;
  /// Whether set_exact_sums is on.
  bool exact_sums() const override { return exact_sums_; }

  /// One key/value cache per block for `slots` sequences of the whole context, sized for the
  /// heads this rank computes.
  std::vector<KeyValueCache> make_caches(std::int64_t slots) override;
  /// Incremental forward of the rows `rows` places (i64 tokens [rows]; see DecodeRows) with the
  /// keys and values of earlier positions in `caches` (make_caches; this call's rows are added):
  /// logits [rows, vocabulary]. Every module runs as in forward(), so each row's logits are the
  /// bits forward() gives that position of its whole sequence.
  Tensor decode(const Tensor& tokens, const DecodeRows& rows,
                std::vector<KeyValueCache>& caches) override;
  std::int64_t context() const override { return config_.context; }
  std::int64_t vocabulary() const override { return config_.vocabulary; }
  std::int64_t layers() const override { return config_.layers; }
  std::int64_t dim() const override { return config_.dim; }
  DecoderConfig decoder_config() const override;
  /// gpt_config_text of its config.
  std::string config_text() const override;

 private:
  GptConfig config_;
  bool exact_sums_ = false;
  TokenPositionEmbedding embedding_;
  std::vector<std::unique_ptr<TransformerBlock>> blocks_;
  LanguageModelHead head_;
};

}  // namespace meshtensor::nn
