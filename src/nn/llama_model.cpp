#include <cmath>
#include <map>

#include <fmt/format.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/core/memory.hpp>
#include <meshtensor/core/random.hpp>
#include <meshtensor/core/setting_text.hpp>
#include <meshtensor/core/shape.hpp>
#include <meshtensor/nn/llama.hpp>
#include <meshtensor/nn/models.hpp>

namespace meshtensor::nn {

namespace {

constexpr std::string_view kLlamaUsage =
    "llama or llama:layers=L,heads=H,kv_heads=K,dim=D,ffn=F,context=T,rope_theta=R,norm_eps=E,"
    "qk_norm=0|1,tie=0|1,head_dim=N,qkv_bias=0|1,out_bias=0|1,mlp_bias=0|1,"
    "rope_scaling=linear:F|llama3:F:LOW:HIGH:ORIGINAL";

/// Longest context a Llama may name (Llama 3.1's 131072 and then some).
constexpr std::int64_t kMaxLlamaContext = std::int64_t{1} << 20;

/// "linear:F" or "llama3:F:LOW:HIGH:ORIGINAL".
kernels::RotaryScaling parse_rope_scaling(const std::string& value, const std::string& what) {
  const std::vector<std::string_view> parts = split(value, ':');
  kernels::RotaryScaling scaling;
  const auto factor = [&](std::size_t i, const char* name) {
    return real_setting(fmt::format("{} {}", what, name), std::string(parts[i]), 1e-9, 1e9);
  };
  if (parts[0] == "linear" && parts.size() == 2) {
    scaling.kind = kernels::RotaryScaling::Kind::linear;
    scaling.factor = factor(1, "factor");
  } else if (parts[0] == "llama3" && parts.size() == 5) {
    scaling.kind = kernels::RotaryScaling::Kind::llama3;
    scaling.factor = factor(1, "factor");
    scaling.low_freq_factor = factor(2, "low_freq_factor");
    scaling.high_freq_factor = factor(3, "high_freq_factor");
    scaling.original_context =
        integer_setting(what + " original context", std::string(parts[4]), 1, kMaxLlamaContext);
    if (!(scaling.high_freq_factor > scaling.low_freq_factor)) {
      throw ParseError(fmt::format("{}: high_freq_factor {} must be above low_freq_factor {}", what,
                                   scaling.high_freq_factor, scaling.low_freq_factor));
    }
  } else if (parts[0] != "none" || parts.size() != 1) {
    throw ParseError(
        fmt::format("{}: '{}' is not linear:F, llama3:F:LOW:HIGH:ORIGINAL or none", what, value));
  }
  return scaling;
}

std::string rope_scaling_text(const kernels::RotaryScaling& s) {
  switch (s.kind) {
    case kernels::RotaryScaling::Kind::none:
      return "none";
    case kernels::RotaryScaling::Kind::linear:
      return fmt::format("linear:{}", s.factor);
    case kernels::RotaryScaling::Kind::llama3:
      return fmt::format("llama3:{}:{}:{}:{}", s.factor, s.low_freq_factor, s.high_freq_factor,
                         s.original_context);
  }
  return "none";
}

/// Sets one key of `config` from its text; false for an unknown key.
bool set_llama_key(LlamaConfig& config, std::string_view key, const std::string& value,
                   const std::string& what) {
  const std::map<std::string_view, std::pair<std::int64_t*, std::int64_t>> integers = {
      {"layers", {&config.layers, 256}},     {"heads", {&config.heads, 256}},
      {"kv_heads", {&config.kv_heads, 256}}, {"dim", {&config.dim, 8192}},
      {"ffn", {&config.ffn, 65536}},         {"context", {&config.context, kMaxLlamaContext}},
      {"head_dim", {&config.head_dim, 1024}}};
  if (const auto entry = integers.find(key); entry != integers.end()) {
    *entry->second.first = integer_setting(what, value, 1, entry->second.second);
  } else if (key == "rope_theta") {
    config.rope_theta = real_setting(what, value, 1.0 + 1e-9, 1e9);
  } else if (key == "norm_eps") {
    config.norm_eps = real_setting(what, value, 1e-12, 0.1);
  } else if (key == "qk_norm") {
    config.qk_norm = bool_setting(what, value);
  } else if (key == "tie") {
    config.tie = bool_setting(what, value);
  } else if (key == "qkv_bias") {
    config.qkv_bias = bool_setting(what, value);
  } else if (key == "out_bias") {
    config.out_bias = bool_setting(what, value);
  } else if (key == "mlp_bias") {
    config.mlp_bias = bool_setting(what, value);
  } else if (key == "rope_scaling") {
    config.rope_scaling = parse_rope_scaling(value, what);
  } else {
    return false;
  }
  return true;
}

/// ParseError naming `text` unless the shape splits as the layers need.
void check_llama_shape(const LlamaConfig& c, const std::string& text) {
  if (c.heads % c.kv_heads != 0) {
    throw ParseError(fmt::format("model '{}': {} kv_heads do not divide the {} heads", text,
                                 c.kv_heads, c.heads));
  }
  if (c.head_dim == 0 && c.dim % c.heads != 0) {
    throw ParseError(fmt::format(
        "model '{}': dim {} does not split into {} heads (give head_dim=N for heads of another "
        "width)",
        text, c.dim, c.heads));
  }
  if (llama_head_dim(c) % 2 != 0) {
    throw ParseError(
        fmt::format("model '{}': the head dim {} is odd; rotary embeddings turn pairs of values",
                    text, llama_head_dim(c)));
  }
}

/// `config` once it is a valid Llama whose parameters fit in memory.
const LlamaConfig& checked_llama_config(const LlamaConfig& config) {
  check_llama_shape(config, llama_config_text(config));
  if (config.vocabulary < 1)
    throw InvalidArgument(fmt::format("llama: vocabulary {} is below 1", config.vocabulary));
  require_memory(2.0 * 4.0 * static_cast<double>(llama_parameter_count(config)),
                 fmt::format("the Llama {} ({} parameters)", llama_config_text(config),
                             llama_parameter_count(config)));
  return config;
}

}  // namespace

bool is_llama_model(const std::string& text) {
  return text == "llama" || text.rfind("llama:", 0) == 0;
}

LlamaConfig parse_llama_config(const std::string& text) {
  LlamaConfig config;
  if (text == "llama") return config;
  if (!is_llama_model(text))
    throw ParseError(fmt::format("model '{}' is not a llama (expected {})", text, kLlamaUsage));
  std::map<std::string_view, bool> seen;
  for (std::string_view part : split(std::string_view(text).substr(6), ',')) {
    const auto equals = part.find('=');
    const std::string_view key = part.substr(0, equals);
    if (equals == std::string_view::npos ||
        !set_llama_key(config, key, std::string(part.substr(equals + 1)),
                       fmt::format("model '{}': {}", text, key))) {
      throw ParseError(
          fmt::format("'{}' in model '{}' is not a key=value of {}", part, text, kLlamaUsage));
    }
    if (seen[key]) throw ParseError(fmt::format("model '{}' gives {} twice", text, key));
    seen[key] = true;
  }
  check_llama_shape(config, text);
  return config;
}

std::string llama_config_text(const LlamaConfig& c) {
  std::string text = fmt::format(
      "llama:layers={},heads={},kv_heads={},dim={},ffn={},context={},rope_theta={},norm_eps={},"
      "qk_norm={},tie={}",
      c.layers, c.heads, c.kv_heads, c.dim, c.ffn, c.context, c.rope_theta, c.norm_eps,
      c.qk_norm ? 1 : 0, c.tie ? 1 : 0);
  // The keys published architectures added come only where they are not their defaults, so the
  // texts of earlier checkpoints read back as they were written.
  if (c.head_dim > 0 && (c.heads < 1 || c.head_dim * c.heads != c.dim))
    text += fmt::format(",head_dim={}", c.head_dim);
  if (c.qkv_bias) text += ",qkv_bias=1";
  if (c.out_bias) text += ",out_bias=1";
  if (c.mlp_bias) text += ",mlp_bias=1";
  if (c.rope_scaling.kind != kernels::RotaryScaling::Kind::none)
    text += ",rope_scaling=" + rope_scaling_text(c.rope_scaling);
  return text;
}

std::int64_t llama_parameter_count(const LlamaConfig& c) {
  const std::int64_t hd = llama_head_dim(c);
  const std::int64_t qkv = (c.heads + 2 * c.kv_heads) * hd;
  const std::int64_t attention = c.dim * qkv + c.heads * hd * c.dim + (c.qk_norm ? 2 * hd : 0) +
                                 (c.qkv_bias ? qkv : 0) + (c.out_bias ? c.dim : 0);
  const std::int64_t mlp = 3 * c.dim * c.ffn + (c.mlp_bias ? 2 * c.ffn + c.dim : 0);
  const std::int64_t block = 2 * c.dim + attention + mlp;
  return c.vocabulary * c.dim + c.layers * block + c.dim + (c.tie ? 0 : c.dim * c.vocabulary);
}

LlamaHead::LlamaHead(const LlamaConfig& config, std::uint64_t seed, Parameter* tied_table)
    : norm_(config.dim, config.norm_eps),
      output_(config.dim, config.vocabulary, seed, config.init_std, /*bias=*/false) {
  prefix_parameter_names(norm_, "norm");
  prefix_parameter_names(output_, "output");
  if (tied_table != nullptr) output_.tie_weight_to(*tied_table);
}

Tensor LlamaHead::forward(const Tensor& input) {
  return run_forward(output_, run_forward(norm_, input));
}

Tensor LlamaHead::backward(const Tensor& grad_output, GradientSink& sink, bool need_input_grad) {
  return run_backward(norm_, run_backward(output_, grad_output, sink, true), sink, need_input_grad);
}

std::vector<Parameter*> LlamaHead::parameters() {
  return parameters_of({&norm_, &output_});
}

std::string LlamaHead::describe() const {
  return fmt::format("LlamaHead({})", output_.describe());
}

std::vector<std::pair<std::string, Module*>> LlamaHead::children() {
  return {{"norm", &norm_}, {"output", &output_}};
}

void LlamaHead::set_exact_blocks(bool on) {
  output_.set_exact_blocks(0, on ? Linear::kEveryColumn : 0);
}

Llama::Llama(const LlamaConfig& config)
    : config_(checked_llama_config(config)),
      embedding_(config.vocabulary, config.dim, mix64(config.seed ^ 0x656d62ULL), config.init_std),
      head_(config, mix64(config.seed ^ 0x68656164ULL),
            config.tie ? &embedding_.weight() : nullptr) {
  prefix_parameter_names(embedding_, "embed.token");
  for (std::int64_t i = 0; i < config.layers; ++i) {
    auto block = std::make_unique<LlamaBlock>(
        config, mix64(config.seed ^ mix64(static_cast<std::uint64_t>(i) + 1)));
    prefix_parameter_names(*block, fmt::format("blocks.{}", i));
    blocks_.push_back(std::move(block));
  }
  prefix_parameter_names(head_, "head");
}

Tensor Llama::forward(const Tensor& tokens) {
  if (!tokens.defined() || tokens.dtype() != DType::i64 || tokens.rank() != 2) {
    throw InvalidArgument(fmt::format("{} takes i64 tokens [batch, sequence], got {}", describe(),
                                      tokens.defined() ? tokens.shape().to_string() : "none"));
  }
  Tensor x = run_forward(embedding_, tokens);
  for (auto& block : blocks_)
    x = run_forward(*block, x);
  return run_forward(head_, x);
}

Tensor Llama::backward(const Tensor& grad_output, GradientSink& sink, bool) {
  Tensor grad = run_backward(head_, grad_output, sink, true);
  for (std::size_t i = blocks_.size(); i-- > 0;)
    grad = run_backward(*blocks_[i], grad, sink, true);
  run_backward(embedding_, grad, sink, false);
  return {};
}

std::vector<KeyValueCache> Llama::make_caches(std::int64_t slots) {
  std::vector<std::int64_t> heads;  // key/value heads: one per group
  for (auto& block : blocks_)
    heads.push_back(block->attention().local_groups());
  return make_layer_caches(slots, heads, llama_head_dim(config_), config_.context);
}

Tensor Llama::decode(const Tensor& tokens, const DecodeRows& rows,
                     std::vector<KeyValueCache>& caches) {
  check_decode_rows(tokens, rows, caches, blocks_.size());
  // Back to whole sequences however this call ends.
  struct Restore {
    Llama& llama;
    ~Restore() {
      for (auto& block : llama.blocks_)
        block->attention().set_decode(nullptr, nullptr);
    }
  } restore{*this};
  for (std::size_t i = 0; i < blocks_.size(); ++i)
    blocks_[i]->attention().set_decode(&rows, &caches[i]);
  const Tensor logits = forward(tokens.reshape(Shape{1, rows.size()}));
  return logits.reshape(Shape{rows.size(), logits.shape()[2]});
}

std::vector<Module*> Llama::units() {
  std::vector<Module*> all{&embedding_};
  for (auto& block : blocks_)
    all.push_back(block.get());
  all.push_back(&head_);
  return all;
}

std::vector<std::vector<Module*>> Llama::parameter_groups() {
  if (!config_.tie) return Decoder::parameter_groups();
  // The tied table is read by the embedding and the head: one group holds both.
  std::vector<std::vector<Module*>> groups{{&embedding_, &head_}};
  for (auto& block : blocks_)
    groups.push_back({block.get()});
  return groups;
}

std::vector<std::pair<std::string, Module*>> Llama::children() {
  std::vector<std::pair<std::string, Module*>> all{{"embed", &embedding_}};
  for (std::size_t i = 0; i < blocks_.size(); ++i)
    all.emplace_back(fmt::format("blocks.{}", i), blocks_[i].get());
  all.emplace_back("head", &head_);
  return all;
}

void Llama::set_sequence_split(SequenceSplit* split) {
  for (auto& block : blocks_)
    block->attention().set_sequence_split(split);
}

void Llama::set_exact_sums(bool on) {
  for (auto& block : blocks_)
    block->set_exact_blocks(on);
  head_.set_exact_blocks(on);
  exact_sums_ = on;
}

DecoderConfig Llama::decoder_config() const {
  return config_;
}

std::string Llama::describe() const {
  return fmt::format("Llama({}, vocabulary={})", llama_config_text(config_), config_.vocabulary);
}

}  // namespace meshtensor::nn
