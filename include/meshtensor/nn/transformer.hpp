#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <meshtensor/nn/decoder.hpp>
#include <meshtensor/nn/decoder_spec.hpp>
#include <meshtensor/nn/embedding.hpp>
#include <meshtensor/nn/grouped_attention.hpp>
#include <meshtensor/nn/layers.hpp>

namespace meshtensor::nn {

/// x + attn(norm1(x)), then x + mlp(norm2(x)) over f32 [batch, sequence, dim], as the spec says:
/// LayerNorm or RMSNorm; GroupedQueryAttention (rotary or not, biases, QK-norm); the MLP as two
/// Linears around GELU (fc, proj) or SwiGLU (gate_up laid out in decoder_mlp_blocks() blocks,
/// each block's gate columns then its up columns, so a column-parallel split along whole blocks
/// keeps each pair on one rank; down).
class DecoderBlock : public Module {
 public:
  /// InvalidArgument naming the shape when the spec does not describe a valid block.
  DecoderBlock(const DecoderSpec& spec, std::uint64_t seed);
  Tensor forward(const Tensor& input) override;
  Tensor backward(const Tensor& grad_output, GradientSink& sink, bool need_input_grad) override;
  /// Forward up to the MLP's second projection, which only keeps its input.
  void forward_for_backward(const Tensor& input) override;
  std::vector<Parameter*> parameters() override;
  std::string describe() const override;
  /// "norm1", "attn", "norm2", then the MLP's first projection, "mlp.act" and its second
  /// (mlp_projection_names).
  std::vector<std::pair<std::string, Module*>> children() override;
  /// Exact sums over whole groups, heads and MLP blocks (GroupedQueryAttention::
  /// set_exact_blocks, Linear::set_exact_blocks).
  void set_exact_blocks(bool on);
  /// The attention layer.
  GroupedQueryAttention& attention() { return attention_; }

 private:
  std::int64_t mlp_blocks_;
  std::pair<std::string, std::string> mlp_names_;
  std::unique_ptr<Module> norm1_;
  GroupedQueryAttention attention_;
  std::unique_ptr<Module> norm2_;
  Linear mlp_in_;
  std::unique_ptr<Module> activation_;
  Linear mlp_out_;
};

/// The final norm and the language-model head: f32 [batch, sequence, dim] -> logits [batch,
/// sequence, vocabulary].
class DecoderHead : public Module {
 public:
  /// With `tied_table` (the token embedding's [vocabulary, dim], which must outlive it) the
  /// output's weight is that table transposed (Linear::tie_weight_to) without a bias; otherwise a
  /// weight of its own, with a bias where spec.head_bias says.
  DecoderHead(const DecoderSpec& spec, std::uint64_t seed, Parameter* tied_table = nullptr);
  Tensor forward(const Tensor& input) override;
  Tensor backward(const Tensor& grad_output, GradientSink& sink, bool need_input_grad) override;
  std::vector<Parameter*> parameters() override;
  std::string describe() const override;
  /// "norm", "output".
  std::vector<std::pair<std::string, Module*>> children() override;
  /// The input gradient as the exact sum over the vocabulary's products.
  void set_exact_blocks(bool on);
  /// The output layer.
  Linear& output() { return output_; }

 private:
  std::unique_ptr<Module> norm_;
  Linear output_;
};

/// The decoder a DecoderSpec describes: i64 tokens [batch, sequence] (sequence at most context)
/// -> f32 logits [batch, sequence, vocabulary]; the logits of position t depend on tokens 0..t of
/// their own sequence only. Its children (units()) are called through run_forward / run_backward,
/// so a sharded runtime can make each one a parameter group.
class TransformerDecoder : public Decoder {
 public:
  /// The same spec gives the same initial bits everywhere. InvalidArgument naming the spec when
  /// its shape is not valid; ResourceError when its parameters do not fit in memory (before
  /// anything is allocated).
  explicit TransformerDecoder(const DecoderSpec& spec);
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
  /// The spec the model was built from.
  const DecoderSpec& spec() const { return spec_; }
  /// Exact mode's sums, whose bits do not depend on the tensor-parallel degree: every sum that a
  /// tensor-parallel split divides among ranks is the correctly rounded sum of terms fixed by
  /// the model alone. Attention output projection: one f32 partial product per head; MLP output
  /// projection: one per MLP block; the input gradients of qkv and the MLP's first layer:
  /// likewise per group and block; the head's input gradient: the exact sum of its products
  /// over the vocabulary. Off: ordered f32 products throughout.
  void set_exact_sums(bool on) override;
  void set_sequence_split(SequenceSplit* split) override;
  /// Whether set_exact_sums is on.
  bool exact_sums() const override { return exact_sums_; }
  /// One key/value cache per block for `slots` sequences of the whole context, of the key/value
  /// heads this rank computes (K, not H).
  std::vector<KeyValueCache> make_caches(std::int64_t slots) override;
  /// Incremental forward of the rows `rows` places (i64 tokens [rows]; see DecodeRows) with the
  /// keys and values of earlier positions in `caches` (make_caches; this call's rows are added):
  /// logits [rows, vocabulary]. Every module runs as in forward(), so each row's logits are the
  /// bits forward() gives that position of its whole sequence.
  Tensor decode(const Tensor& tokens, const DecodeRows& rows,
                std::vector<KeyValueCache>& caches) override;
  std::int64_t context() const override { return spec_.context; }
  std::int64_t vocabulary() const override { return spec_.vocabulary; }
  std::int64_t layers() const override { return spec_.layers; }
  std::int64_t dim() const override { return spec_.dim; }
  DecoderSpec decoder_spec() const override { return spec_; }
  /// decoder_spec_text of its spec.
  std::string config_text() const override;

 private:
  /// Back to whole sequences (decode's end).
  void end_decode();

  DecoderSpec spec_;
  bool exact_sums_ = false;
  std::unique_ptr<Module> embedding_;
  TokenPositionEmbedding* learned_positions_;  // embedding_ when positions are learned
  Embedding* token_table_;                     // the token rows (of embedding_)
  std::vector<std::unique_ptr<DecoderBlock>> blocks_;
  DecoderHead head_;
};

}  // namespace meshtensor::nn
