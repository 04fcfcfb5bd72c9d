#include "llama_family.hpp"

#include <cmath>
#include <functional>
#include <optional>

#include <fmt/format.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/core/untrusted_json.hpp>

namespace meshtensor::hf {

using Json = nlohmann::json;

namespace {

constexpr double kDefaultRopeTheta = 10000.0;
/// Longest context a config may name.
constexpr std::int64_t kMaxContext = std::int64_t{1} << 20;

/// The rotation: theta and the rescaling, from any of its spellings: transformers 4's top-level
/// `rope_theta` and `rope_scaling`, transformers 5's `rope_parameters {rope_type, rope_theta,
/// ...}`. Spellings that are given must agree.
struct Rope {
  double theta = kDefaultRopeTheta;
  kernels::RotaryScaling scaling;
};

double positive_number(const ConfigReader& c, const char* key, const Json& spec, const char* name) {
  if (!spec.contains(name))
    throw c.bad(key, fmt::format("has no {}, which its rope_type needs", name));
  const Json& value = spec[name];
  if (!value.is_number() || !std::isfinite(value.get<double>()) || value.get<double>() <= 0)
    throw c.bad(key, fmt::format("has {} {}, not a positive number", name, json_excerpt(value)));
  return value.get<double>();
}

/// The rescaling one spelling gives (`key`: rope_scaling or rope_parameters).
kernels::RotaryScaling rope_scaling_of(const ConfigReader& c, const char* key, const Json& spec) {
  std::string type = "default";
  for (const char* name : {"rope_type", "type"}) {
    if (!spec.contains(name)) continue;
    if (!spec[name].is_string())
      throw c.bad(key, fmt::format("has {} {}, not a string", name, json_excerpt(spec[name])));
    type = spec[name].get<std::string>();
  }
  kernels::RotaryScaling scaling;
  if (type == "linear") {
    scaling.kind = kernels::RotaryScaling::Kind::linear;
    scaling.factor = positive_number(c, key, spec, "factor");
  } else if (type == "llama3") {
    scaling.kind = kernels::RotaryScaling::Kind::llama3;
    scaling.factor = positive_number(c, key, spec, "factor");
    scaling.low_freq_factor = positive_number(c, key, spec, "low_freq_factor");
    scaling.high_freq_factor = positive_number(c, key, spec, "high_freq_factor");
    const double original = positive_number(c, key, spec, "original_max_position_embeddings");
    if (original != std::floor(original) || original > kMaxContext)
      throw c.bad(key,
                  fmt::format("has original_max_position_embeddings {}, not a context", original));
    scaling.original_context = static_cast<std::int64_t>(original);
    if (!(scaling.high_freq_factor > scaling.low_freq_factor))
      throw c.bad(key, "has high_freq_factor not above low_freq_factor");
  } else if (type != "default") {
    throw c.bad(key, fmt::format("has rope_type '{}': meshtensor computes the rotations of "
                                 "rope_type default, linear and llama3",
                                 type));
  }
  return scaling;
}

/// Checks the parts of one spelling every rope_type shares, and takes its theta.
void check_rope_spec(const ConfigReader& c, const char* key, const Json& spec,
                     const std::function<void(double, const std::string&)>& take_theta) {
  if (spec.contains("partial_rotary_factor") &&
      !(spec["partial_rotary_factor"].is_number() &&
        spec["partial_rotary_factor"].get<double>() == 1.0)) {
    throw c.bad(key, fmt::format("has partial_rotary_factor {}: meshtensor rotates every "
                                 "feature of a head",
                                 json_excerpt(spec["partial_rotary_factor"])));
  }
  for (const auto& [name, value] : spec.items()) {
    if (value.is_object()) {
      throw c.bad(key, fmt::format("holds RoPE parameters per layer type ('{}'): meshtensor "
                                   "computes one rotation for every layer",
                                   name));
    }
  }
  if (spec.contains("rope_theta")) {
    const Json& value = spec["rope_theta"];
    if (!value.is_number() || !std::isfinite(value.get<double>()) || value.get<double>() <= 0)
      throw c.bad(key,
                  fmt::format("has rope_theta {}, not a positive number", json_excerpt(value)));
    take_theta(value.get<double>(), std::string(key) + ".rope_theta");
  }
}

Rope rope_of(const ConfigReader& c) {
  std::optional<double> theta;
  std::string theta_source;
  const auto take_theta = [&](double value, const std::string& from) {
    if (theta && *theta != value) {
      throw c.bad(from, fmt::format("gives RoPE theta {} but {} gives {}: which one the model "
                                    "was trained with is unknown",
                                    value, theta_source, *theta));
    }
    theta = value;
    theta_source = from;
  };
  if (c.has("rope_theta")) take_theta(c.number("rope_theta", kDefaultRopeTheta), "rope_theta");
  Rope rope;
  const char* scaling_source = nullptr;
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    if (!c.has(key)) continue;
    const Json& spec = c.at(key);
    if (!spec.is_object())
      throw c.bad(key, fmt::format("is {}, not an object", json_excerpt(spec)));
    check_rope_spec(c, key, spec, take_theta);
    const kernels::RotaryScaling scaling = rope_scaling_of(c, key, spec);
    if (scaling_source != nullptr && scaling != rope.scaling) {
      throw c.bad(key, fmt::format("rescales RoPE otherwise than {}: which one the model was "
                                   "trained with is unknown",
                                   scaling_source));
    }
    rope.scaling = scaling;
    scaling_source = key;
  }
  rope.theta = theta.value_or(kDefaultRopeTheta);
  return rope;
}

Json rope_scaling_json(const kernels::RotaryScaling& s) {
  switch (s.kind) {
    case kernels::RotaryScaling::Kind::none:
      return nullptr;
    case kernels::RotaryScaling::Kind::linear:
      return {{"rope_type", "linear"}, {"factor", s.factor}};
    case kernels::RotaryScaling::Kind::llama3:
      return {{"rope_type", "llama3"},
              {"factor", s.factor},
              {"low_freq_factor", s.low_freq_factor},
              {"high_freq_factor", s.high_freq_factor},
              {"original_max_position_embeddings", s.original_context}};
  }
  return nullptr;
}

/// Qwen3's sliding-window attention as Qwen3Config lays it out: without `use_sliding_window`
/// no layer has a window (the class nulls `sliding_window`); with it, the layers `layer_types`
/// names sliding_attention, or else those from `max_window_layers` on, attend over
/// `sliding_window` positions. Refused unless every window covers the context.
void check_sliding_window(const ConfigReader& c, std::int64_t layers, std::int64_t context) {
  const bool sliding = c.flag("use_sliding_window", false);
  const std::int64_t window = c.integer("sliding_window", 4096, 1, std::int64_t{1} << 40);
  const std::int64_t first_sliding = c.integer("max_window_layers", 28, 0, std::int64_t{1} << 40);
  bool any_sliding = sliding && first_sliding < layers;
  if (c.has("layer_types")) {
    const Json& types = c.at("layer_types");
    if (!types.is_array() || types.size() != static_cast<std::size_t>(layers))
      throw c.bad("layer_types",
                  fmt::format("is {}, not a list of {} layer types", json_excerpt(types), layers));
    any_sliding = false;
    for (const Json& type : types) {
      const bool full = type == "full_attention";
      if (!full && type != "sliding_attention")
        throw c.bad("layer_types", fmt::format("names {}, not full_attention or "
                                               "sliding_attention",
                                               json_excerpt(type)));
      any_sliding = any_sliding || (sliding && !full);
    }
  }
  if (any_sliding && window < context) {
    throw c.bad("use_sliding_window",
                fmt::format("is true: layers attend over a sliding window of {} positions, "
                            "shorter than the context of {}; meshtensor computes full causal "
                            "attention",
                            window, context));
  }
}

/// The biases a config asks for: a Llama's attention_bias puts them on q, k, v and o, its
/// mlp_bias on the MLP; Qwen2 has them on q, k and v alone.
void read_biases(const ConfigReader& c, const LlamaClass& cls, nn::DecoderSpec& llama) {
  const bool attention = cls.bias_keys && c.flag("attention_bias", false);
  llama.qkv_bias = cls.qkv_bias || attention;
  llama.out_bias = attention;
  llama.mlp_bias = cls.mlp_bias_key && c.flag("mlp_bias", false);
}

}  // namespace

nn::DecoderSpec LlamaFamilyArchitecture::parse(ConfigReader& c) const {
  const LlamaClass& cls = class_;
  c.set_class(cls.config_class);
  nn::DecoderSpec llama;
  llama.dim = c.integer("hidden_size", 4096, 1, 65536);
  llama.heads = c.integer("num_attention_heads", 32, 1, 1024);
  llama.kv_heads =
      c.integer("num_key_value_heads", cls.kv_heads > 0 ? cls.kv_heads : llama.heads, 1, 1024);
  llama.layers = c.integer("num_hidden_layers", 32, 1, 1024);
  llama.context = c.integer("max_position_embeddings", cls.context, 1, kMaxContext);
  llama.ffn = c.integer("intermediate_size", cls.ffn, 1, 1 << 20);
  llama.head_dim =
      c.integer("head_dim", cls.head_dim > 0 ? cls.head_dim : llama.dim / llama.heads, 1, 1024);
  const Rope rope = rope_of(c);
  llama.rope_theta = rope.theta;
  llama.rope_scaling = rope.scaling;
  llama.norm_eps = c.number("rms_norm_eps", 1e-6);
  llama.qk_norm = cls.qk_norm;
  llama.tie = c.flag("tie_word_embeddings", false);
  read_biases(c, cls, llama);
  const std::string act = c.text("hidden_act", "silu");
  c.require("hidden_act", act == "silu" || act == "swish",  // one function in transformers
            fmt::format("is '{}': the Llama family's MLP is SwiGLU (silu)", act));
  if (cls.window == SlidingWindow::qwen) {
    check_sliding_window(c, llama.layers, llama.context);
  } else {
    c.require("use_sliding_window", !c.flag("use_sliding_window", false),
              fmt::format("is true: {} has no sliding window", cls.config_class));
  }
  c.integer("pretraining_tp", 1, 1, 1 << 20);  // inert: the same products, split or not
  // SmolLM's configs carry it (false): pairs of neighbours would be another rotation.
  c.require("rope_interleaved", !c.flag("rope_interleaved", false),
            "is true: meshtensor rotates the two halves of a head (rotate_half), not "
            "interleaved pairs");
  try {
    llama = nn::parse_llama_config(nn::llama_config_text(llama));
  } catch (const Error& e) {
    throw DataError(fmt::format("{}: {}", c.file(), e.what()));
  }
  llama.vocabulary = c.integer("vocab_size", cls.vocabulary, 1, nn::kMaxVocabulary);
  return llama;
}

bool LlamaFamilyArchitecture::exports(const nn::DecoderSpec& config) const {
  return config.family == nn::DecoderFamily::llama && exports_(config);
}

void LlamaFamilyArchitecture::write(const nn::DecoderSpec& config, Json& out) const {
  const LlamaClass& cls = class_;
  out.update({{"hidden_size", config.dim},
              {"intermediate_size", config.ffn},
              {"num_hidden_layers", config.layers},
              {"num_attention_heads", config.heads},
              {"num_key_value_heads", config.kv_heads},
              {"head_dim", nn::decoder_head_dim(config)},
              {"max_position_embeddings", config.context},
              {"rms_norm_eps", config.norm_eps},
              {"rope_theta", config.rope_theta},
              {"rope_scaling", rope_scaling_json(config.rope_scaling)},
              {"hidden_act", "silu"},
              {"initializer_range", config.init_std},
              {"tie_word_embeddings", config.tie}});
  if (cls.bias_keys) out["attention_bias"] = config.out_bias;
  if (cls.mlp_bias_key) out["mlp_bias"] = config.mlp_bias;
  if (cls.window == SlidingWindow::qwen)
    out.update({{"use_sliding_window", false}, {"sliding_window", nullptr}});
}

void LlamaFamilyArchitecture::links(const nn::DecoderSpec& config, std::vector<Link>& links) const {
  links.push_back({"model.embed_tokens.weight", "embed.token.weight"});
  const char* projections[] = {"q_proj", "k_proj", "v_proj"};
  for (std::int64_t i = 0; i < config.layers; ++i) {
    const std::string hf = fmt::format("model.layers.{}.", i);
    const std::string ours = fmt::format("blocks.{}.", i);
    links.push_back({hf + "input_layernorm.weight", ours + "norm1.weight"});
    for (int part = 0; part < 3; ++part) {
      const std::string tensor = hf + "self_attn." + projections[part];
      links.push_back(
          {tensor + ".weight", ours + "attn.qkv.weight", Columns::llama_qkv, part, true});
      if (config.qkv_bias)
        links.push_back({tensor + ".bias", ours + "attn.qkv.bias", Columns::llama_qkv, part});
    }
    links.push_back(
        {hf + "self_attn.o_proj.weight", ours + "attn.proj.weight", Columns::identity, 0, true});
    if (config.out_bias) links.push_back({hf + "self_attn.o_proj.bias", ours + "attn.proj.bias"});
    if (config.qk_norm) {
      links.push_back({hf + "self_attn.q_norm.weight", ours + "attn.q_norm.weight"});
      links.push_back({hf + "self_attn.k_norm.weight", ours + "attn.k_norm.weight"});
    }
    links.push_back({hf + "post_attention_layernorm.weight", ours + "norm2.weight"});
    for (int part = 0; part < 2; ++part) {
      const std::string tensor = hf + (part == 0 ? "mlp.gate_proj" : "mlp.up_proj");
      links.push_back(
          {tensor + ".weight", ours + "mlp.gate_up.weight", Columns::gate_up, part, true});
      if (config.mlp_bias)
        links.push_back({tensor + ".bias", ours + "mlp.gate_up.bias", Columns::gate_up, part});
    }
    links.push_back(
        {hf + "mlp.down_proj.weight", ours + "mlp.down.weight", Columns::identity, 0, true});
    if (config.mlp_bias) links.push_back({hf + "mlp.down_proj.bias", ours + "mlp.down.bias"});
  }
  links.push_back({"model.norm.weight", "head.norm.weight"});
  if (!config.tie)
    links.push_back({"lm_head.weight", "head.output.weight", Columns::identity, 0, true});
}

}  // namespace meshtensor::hf
