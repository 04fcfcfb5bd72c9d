// GPT2LMHeadModel: GPT-2's own folders (tensors under "transformer.", or without it as
// GPT2Model saves them; its attention-mask buffers ignored) and meshtensor's tied GPTs.

#include <fmt/format.h>

#include <meshtensor/core/error.hpp>

#include "../architecture.hpp"

namespace meshtensor::hf {

namespace {

constexpr double kGpt2LayerNormEps = 1e-5;  // nn::LayerNorm's epsilon

nn::DecoderSpec parse_gpt2(ConfigReader& c) {
  c.set_class("GPT2Config");
  nn::GptConfig gpt;
  gpt.layers = c.integer("n_layer", "num_hidden_layers", 12, 1, 256);
  gpt.heads = c.integer("n_head", "num_attention_heads", 12, 1, 256);
  gpt.dim = c.integer("n_embd", "hidden_size", 768, 1, 8192);
  gpt.context = c.integer("n_positions", "max_position_embeddings", 1024, 1, 8192);
  gpt.vocabulary = c.integer("vocab_size", 50257, 1, nn::kMaxVocabulary);
  gpt.tie = true;
  const std::string activation = c.text("activation_function", "gelu_new");
  // transformers' names of GELU's tanh form (gelu_fast writes sqrt(2/pi) to 10 digits).
  c.require(
      "activation_function",
      activation == "gelu_new" || activation == "gelu_pytorch_tanh" || activation == "gelu_fast",
      fmt::format("is '{}': the GPT computes GELU's tanh form (gelu_new)", activation));
  if (c.has("n_inner")) {
    c.require("n_inner", c.integer("n_inner", 0, 1, 1 << 20) == 4 * gpt.dim,
              fmt::format("is not 4 x n_embd ({}): the GPT's MLP is 4 x dim wide", 4 * gpt.dim));
  }
  const double eps = c.number("layer_norm_epsilon", kGpt2LayerNormEps);
  c.require("layer_norm_epsilon", eps == kGpt2LayerNormEps,
            fmt::format("is {}: the GPT's LayerNorm epsilon is 1e-05", eps));
  c.require("tie_word_embeddings", c.flag("tie_word_embeddings", true),
            "is false: the GPT's head is GPT-2's, the token table");
  c.require("scale_attn_weights", c.flag("scale_attn_weights", true),
            "is false: the GPT scales attention scores by 1/sqrt(head_dim)");
  c.require("scale_attn_by_inverse_layer_idx", !c.flag("scale_attn_by_inverse_layer_idx", false),
            "is true: the GPT scales attention by 1/sqrt(head_dim) alone");
  c.require("add_cross_attention", !c.flag("add_cross_attention", false),
            "is true: the GPT is a decoder without cross-attention");
  c.flag("reorder_and_upcast_attn", false);  // inert: the GPT computes attention in f32
  c.require("is_encoder_decoder", !c.flag("is_encoder_decoder", false), "is true");
  try {
    const nn::GptConfig checked = nn::parse_gpt_config(nn::gpt_config_text(gpt));
    gpt.seed = checked.seed;
  } catch (const Error& e) {
    throw DataError(fmt::format("{}: {}", c.file(), e.what()));
  }
  return nn::gpt_spec(gpt);
}

void write_gpt2(const nn::DecoderSpec& config, nlohmann::json& out) {
  out.update({{"n_layer", config.layers},
              {"n_head", config.heads},
              {"n_embd", config.dim},
              {"n_positions", config.context},
              {"n_ctx", config.context},
              {"n_inner", nullptr},
              {"activation_function", "gelu_new"},
              {"layer_norm_epsilon", kGpt2LayerNormEps},
              {"resid_pdrop", 0.0},
              {"embd_pdrop", 0.0},
              {"attn_pdrop", 0.0},
              {"initializer_range", config.init_std},
              {"scale_attn_weights", true},
              {"tie_word_embeddings", true}});
}

void gpt2_links(const nn::DecoderSpec& config, std::vector<Link>& links) {
  links.push_back({"transformer.wte.weight", "embed.token.weight"});
  links.push_back({"transformer.wpe.weight", "embed.position.weight"});
  for (std::int64_t i = 0; i < config.layers; ++i) {
    const std::string hf = fmt::format("transformer.h.{}.", i);
    const std::string ours = fmt::format("blocks.{}.", i);
    for (const char* kind : {"weight", "bias"}) {
      links.push_back({hf + "ln_1." + kind, ours + "norm1." + kind});
      links.push_back({hf + "attn.c_attn." + kind, ours + "attn.qkv." + kind, Columns::gpt_qkv});
      links.push_back({hf + "attn.c_proj." + kind, ours + "attn.proj." + kind});
      links.push_back({hf + "ln_2." + kind, ours + "norm2." + kind});
      links.push_back({hf + "mlp.c_fc." + kind, ours + "mlp.fc." + kind});
      links.push_back({hf + "mlp.c_proj." + kind, ours + "mlp.proj." + kind});
    }
  }
  links.push_back({"transformer.ln_f.weight", "head.norm.weight"});
  links.push_back({"transformer.ln_f.bias", "head.norm.bias"});
}

class Gpt2Architecture : public Architecture {
 public:
  Gpt2Architecture() : Architecture("GPT2LMHeadModel", "gpt2", "GPT2Model") {}
  nn::DecoderSpec parse(ConfigReader& c) const override { return parse_gpt2(c); }
  bool exports(const nn::DecoderSpec& config) const override {
    // GPT-2's head is the token table, without a bias.
    return config.family == nn::DecoderFamily::gpt && config.tie;
  }
  void write(const nn::DecoderSpec& config, nlohmann::json& out) const override {
    write_gpt2(config, out);
  }
  void links(const nn::DecoderSpec& config, std::vector<Link>& out) const override {
    gpt2_links(config, out);
  }
};

}  // namespace

const Architecture& gpt2_architecture() {
  static const Gpt2Architecture architecture;
  return architecture;
}

}  // namespace meshtensor::hf
