#include <cmath>

#include <fmt/format.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/core/memory.hpp>
#include <meshtensor/core/random.hpp>
#include <meshtensor/nn/embedding.hpp>
#include <meshtensor/nn/models.hpp>
#include <meshtensor/nn/transformer.hpp>

namespace meshtensor::nn {

namespace {

/// The projections into the residual stream start at init_std / sqrt(2 · layers).
double residual_std(const DecoderSpec& spec) {
  return spec.init_std / std::sqrt(2.0 * static_cast<double>(spec.layers));
}

GroupedAttentionConfig attention_config(const DecoderSpec& s) {
  GroupedAttentionConfig config{s.dim,        s.heads,    s.kv_heads,    s.context,
                                s.rope_theta, s.qk_norm,  s.norm_eps,    s.head_dim,
                                s.qkv_bias,   s.out_bias, s.rope_scaling};
  config.rotary = s.positions == PositionKind::rotary;
  return config;
}

std::unique_ptr<Module> make_norm(const DecoderSpec& spec) {
  if (spec.norm == NormKind::layer_norm)
    return std::make_unique<LayerNorm>(spec.dim, spec.norm_eps);
  return std::make_unique<RMSNorm>(spec.dim, spec.norm_eps);
}

/// `spec` once it describes a valid shape; InvalidArgument naming it otherwise.
const DecoderSpec& checked_shape(const DecoderSpec& spec) {
  if (const std::string problem = decoder_spec_problem(spec); !problem.empty())
    throw InvalidArgument(fmt::format("model {}: {}", decoder_spec_text(spec), problem));
  return spec;
}

/// `spec` once it is valid and its parameters fit in memory: thrown otherwise, before any member
/// allocates.
const DecoderSpec& checked_spec(const DecoderSpec& spec) {
  checked_shape(spec);
  require_memory(
      decoder_model_bytes(spec),
      fmt::format("the {} {} ({} parameters)", spec.family == DecoderFamily::gpt ? "GPT" : "Llama",
                  decoder_spec_text(spec), decoder_parameter_count(spec)));
  return spec;
}

std::unique_ptr<Module> make_embedding(const DecoderSpec& spec) {
  const std::uint64_t seed = mix64(spec.seed ^ 0x656d62ULL);
  std::unique_ptr<Module> embedding;
  if (spec.positions == PositionKind::learned) {
    embedding = std::make_unique<TokenPositionEmbedding>(spec.vocabulary, spec.context, spec.dim,
                                                         seed, spec.init_std);
    prefix_parameter_names(*embedding, "embed");
  } else {
    embedding = std::make_unique<Embedding>(spec.vocabulary, spec.dim, seed, spec.init_std);
    prefix_parameter_names(*embedding, "embed.token");
  }
  return embedding;
}

}  // namespace

DecoderBlock::DecoderBlock(const DecoderSpec& spec, std::uint64_t seed)
    : mlp_blocks_(decoder_mlp_blocks(checked_shape(spec))),
      mlp_names_(mlp_projection_names(spec)),
      norm1_(make_norm(spec)),
      attention_(attention_config(spec), mix64(seed ^ 1), spec.init_std, residual_std(spec)),
      norm2_(make_norm(spec)),
      mlp_in_(spec.dim, (spec.mlp == MlpKind::swiglu ? 2 : 1) * spec.ffn, mix64(seed ^ 2),
              spec.init_std, spec.mlp_bias),
      mlp_out_(spec.ffn, spec.dim, mix64(seed ^ 3), residual_std(spec), spec.mlp_bias) {
  if (spec.mlp == MlpKind::swiglu) {
    activation_ = std::make_unique<SwiGLU>(spec.ffn / mlp_blocks_);
  } else {
    activation_ = std::make_unique<GELU>();
  }
  prefix_parameter_names(*norm1_, "norm1");
  prefix_parameter_names(attention_, "attn");
  prefix_parameter_names(*norm2_, "norm2");
  prefix_parameter_names(mlp_in_, mlp_names_.first);
  prefix_parameter_names(mlp_out_, mlp_names_.second);
}

Tensor DecoderBlock::forward(const Tensor& input) {
  Tensor x = run_forward(attention_, run_forward(*norm1_, input));
  add_into(x, input);
  Tensor y = run_forward(mlp_out_,
                         run_forward(*activation_, run_forward(mlp_in_, run_forward(*norm2_, x))));
  add_into(y, x);
  return y;
}

void DecoderBlock::forward_for_backward(const Tensor& input) {
  Tensor x = run_forward(attention_, run_forward(*norm1_, input));
  add_into(x, input);
  run_forward_for_backward(
      mlp_out_, run_forward(*activation_, run_forward(mlp_in_, run_forward(*norm2_, x))));
}

Tensor DecoderBlock::backward(const Tensor& grad_output, GradientSink& sink, bool need_input_grad) {
  const Tensor dy = grad_output.contiguous();
  const Tensor d_hidden =
      run_backward(*activation_, run_backward(mlp_out_, dy, sink, true), sink, true);
  Tensor dx = run_backward(*norm2_, run_backward(mlp_in_, d_hidden, sink, true), sink, true);
  add_into(dx, dy);
  Tensor d_input =
      run_backward(*norm1_, run_backward(attention_, dx, sink, true), sink, need_input_grad);
  if (!need_input_grad) return {};
  add_into(d_input, dx);
  return d_input;
}

std::vector<Parameter*> DecoderBlock::parameters() {
  return parameters_of({norm1_.get(), &attention_, norm2_.get(), &mlp_in_, &mlp_out_});
}

std::vector<std::pair<std::string, Module*>> DecoderBlock::children() {
  return {{"norm1", norm1_.get()},        {"attn", &attention_},
          {"norm2", norm2_.get()},        {mlp_names_.first, &mlp_in_},
          {"mlp.act", activation_.get()}, {mlp_names_.second, &mlp_out_}};
}

void DecoderBlock::set_exact_blocks(bool on) {
  attention_.set_exact_blocks(on);
  mlp_in_.set_exact_blocks(0, on ? mlp_blocks_ : 0);
  mlp_out_.set_exact_blocks(on ? mlp_blocks_ : 0, 0);
}

std::string DecoderBlock::describe() const {
  return fmt::format("DecoderBlock({}, {}, {})", norm1_->describe(), attention_.describe(),
                     activation_->describe());
}

DecoderHead::DecoderHead(const DecoderSpec& spec, std::uint64_t seed, Parameter* tied_table)
    : norm_(make_norm(spec)),
      output_(spec.dim, spec.vocabulary, seed, spec.init_std,
              tied_table == nullptr && spec.head_bias) {
  prefix_parameter_names(*norm_, "norm");
  prefix_parameter_names(output_, "output");
  if (tied_table != nullptr) output_.tie_weight_to(*tied_table);
}

Tensor DecoderHead::forward(const Tensor& input) {
  return run_forward(output_, run_forward(*norm_, input));
}

Tensor DecoderHead::backward(const Tensor& grad_output, GradientSink& sink, bool need_input_grad) {
  return run_backward(*norm_, run_backward(output_, grad_output, sink, true), sink,
                      need_input_grad);
}

std::vector<Parameter*> DecoderHead::parameters() {
  return parameters_of({norm_.get(), &output_});
}

std::string DecoderHead::describe() const {
  return fmt::format("DecoderHead({}, {})", norm_->describe(), output_.describe());
}

std::vector<std::pair<std::string, Module*>> DecoderHead::children() {
  return {{"norm", norm_.get()}, {"output", &output_}};
}

void DecoderHead::set_exact_blocks(bool on) {
  output_.set_exact_blocks(0, on ? Linear::kEveryColumn : 0);
}

TransformerDecoder::TransformerDecoder(const DecoderSpec& spec)
    : spec_(checked_spec(spec)),
      embedding_(make_embedding(spec)),
      learned_positions_(dynamic_cast<TokenPositionEmbedding*>(embedding_.get())),
      token_table_(learned_positions_ != nullptr ? &learned_positions_->token()
                                                 : dynamic_cast<Embedding*>(embedding_.get())),
      head_(spec, mix64(spec.seed ^ 0x68656164ULL), spec.tie ? &token_table_->weight() : nullptr) {
  for (std::int64_t i = 0; i < spec.layers; ++i) {
    auto block = std::make_unique<DecoderBlock>(
        spec, mix64(spec.seed ^ mix64(static_cast<std::uint64_t>(i) + 1)));
    prefix_parameter_names(*block, fmt::format("blocks.{}", i));
    blocks_.push_back(std::move(block));
  }
  prefix_parameter_names(head_, "head");
}

Tensor TransformerDecoder::forward(const Tensor& tokens) {
  if (!tokens.defined() || tokens.dtype() != DType::i64 || tokens.rank() != 2) {
    throw InvalidArgument(fmt::format("{} takes i64 tokens [batch, sequence], got {}", describe(),
                                      tokens.defined() ? tokens.shape().to_string() : "none"));
  }
  Tensor x = run_forward(*embedding_, tokens);
  for (auto& block : blocks_)
    x = run_forward(*block, x);
  return run_forward(head_, x);
}

Tensor TransformerDecoder::backward(const Tensor& grad_output, GradientSink& sink, bool) {
  Tensor grad = run_backward(head_, grad_output, sink, true);
  for (std::size_t i = blocks_.size(); i-- > 0;)
    grad = run_backward(*blocks_[i], grad, sink, true);
  run_backward(*embedding_, grad, sink, false);
  return {};
}

std::vector<KeyValueCache> TransformerDecoder::make_caches(std::int64_t slots) {
  std::vector<std::int64_t> heads;  // key/value heads: one per group
  for (auto& block : blocks_)
    heads.push_back(block->attention().local_groups());
  return make_layer_caches(slots, heads, decoder_head_dim(spec_), spec_.context);
}

void TransformerDecoder::end_decode() {
  if (learned_positions_ != nullptr) learned_positions_->set_decode(nullptr);
  for (auto& block : blocks_)
    block->attention().set_decode(nullptr, nullptr);
}

Tensor TransformerDecoder::decode(const Tensor& tokens, const DecodeRows& rows,
                                  std::vector<KeyValueCache>& caches) {
  check_decode_rows(tokens, rows, caches, blocks_.size());
  // Back to whole sequences however this call ends.
  struct Restore {
    TransformerDecoder& decoder;
    ~Restore() { decoder.end_decode(); }
  } restore{*this};
  if (learned_positions_ != nullptr) learned_positions_->set_decode(&rows);
  for (std::size_t i = 0; i < blocks_.size(); ++i)
    blocks_[i]->attention().set_decode(&rows, &caches[i]);
  const Tensor logits = forward(tokens.reshape(Shape{1, rows.size()}));
  return logits.reshape(Shape{rows.size(), logits.shape()[2]});
}

std::vector<Module*> TransformerDecoder::units() {
  std::vector<Module*> all{embedding_.get()};
  for (auto& block : blocks_)
    all.push_back(block.get());
  all.push_back(&head_);
  return all;
}

std::vector<std::vector<Module*>> TransformerDecoder::parameter_groups() {
  if (!spec_.tie) return Decoder::parameter_groups();
  // The tied table is read by the embedding and the head: one group holds both.
  std::vector<std::vector<Module*>> groups{{embedding_.get(), &head_}};
  for (auto& block : blocks_)
    groups.push_back({block.get()});
  return groups;
}

std::vector<std::pair<std::string, Module*>> TransformerDecoder::children() {
  std::vector<std::pair<std::string, Module*>> all{{"embed", embedding_.get()}};
  for (std::size_t i = 0; i < blocks_.size(); ++i)
    all.emplace_back(fmt::format("blocks.{}", i), blocks_[i].get());
  all.emplace_back("head", &head_);
  return all;
}

void TransformerDecoder::set_sequence_split(SequenceSplit* split) {
  for (auto& block : blocks_)
    block->attention().set_sequence_split(split);
  if (learned_positions_ != nullptr) learned_positions_->set_sequence_split(split);
}

void TransformerDecoder::set_exact_sums(bool on) {
  for (auto& block : blocks_)
    block->set_exact_blocks(on);
  head_.set_exact_blocks(on);
  exact_sums_ = on;
}

std::string TransformerDecoder::config_text() const {
  return decoder_spec_text(spec_);
}

std::string TransformerDecoder::describe() const {
  return fmt::format("{}({}, vocabulary={})", spec_.family == DecoderFamily::gpt ? "Gpt" : "Llama",
                     decoder_spec_text(spec_), spec_.vocabulary);
}

}  // namespace meshtensor::nn
