// config.json of the three Hugging Face classes meshtensor reads and writes. Every key of
// GPT2Config, LlamaConfig and Qwen3Config is computed, refused by name when it asks for another
// computation, or listed as inert (docs/huggingface.md, "Every key of config.json"). An absent
// key takes its class's own default.

#include "config_json.hpp"

#include <cmath>

#include <fmt/format.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/core/untrusted_json.hpp>
#include <meshtensor/hf/hf_model.hpp>

namespace meshtensor::hf {

using Json = nlohmann::json;

namespace {

constexpr double kGpt2LayerNormEps = 1e-5;  // nn::LayerNorm's epsilon
constexpr double kDefaultRopeTheta = 10000.0;

/// Reads the keys of one config.json, each with its class's default when absent or null.
class ConfigReader {
 public:
  ConfigReader(const Json& config, const std::string& file) : config_(config), file_(file) {}
  DataError bad(const std::string& key, const std::string& why) const {
    return DataError(fmt::format("{}: \"{}\" {}", file_, key, why));
  }
  bool has(const std::string& key) const {
    return config_.contains(key) && !config_[key].is_null();
  }
  const Json& at(const std::string& key) const { return config_[key]; }
  std::int64_t integer(const std::string& key, std::int64_t fallback, std::int64_t low,
                       std::int64_t high) const {
    const std::int64_t value = has(key) ? checked_integer(key, at(key), low, high) : fallback;
    if (value < low || value > high) {
      throw bad(key, fmt::format("is absent: {}'s default {} is outside [{}, {}]", class_name_,
                                 fallback, low, high));
    }
    return value;
  }
  /// A key with another name transformers maps onto it (GPT2Config's hidden_size is n_embd):
  /// the one given, or both when they agree.
  std::int64_t integer(const std::string& key, const std::string& alias, std::int64_t fallback,
                       std::int64_t low, std::int64_t high) const {
    if (has(key) && has(alias) && at(key) != at(alias)) {
      throw bad(key, fmt::format("is {} but \"{}\" is {}: they name the same setting",
                                 json_excerpt(at(key)), alias, json_excerpt(at(alias))));
    }
    return integer(has(alias) && !has(key) ? alias : key, fallback, low, high);
  }
  double number(const std::string& key, double fallback) const {
    if (!has(key)) return fallback;
    if (!at(key).is_number() || !std::isfinite(at(key).get<double>()))
      throw bad(key, fmt::format("is {}, not a finite number", json_excerpt(at(key))));
    return at(key).get<double>();
  }
  bool flag(const std::string& key, bool fallback) const {
    if (!has(key)) return fallback;
    if (!at(key).is_boolean())
      throw bad(key, fmt::format("is {}, not true or false", json_excerpt(at(key))));
    return at(key).get<bool>();
  }
  std::string text(const std::string& key, const std::string& fallback) const {
    if (!has(key)) return fallback;
    if (!at(key).is_string())
      throw bad(key, fmt::format("is {}, not a string", json_excerpt(at(key))));
    return at(key).get<std::string>();
  }
  /// Refuses a setting meshtensor does not compute.
  void require(const std::string& key, bool holds, const std::string& why) const {
    if (!holds) throw bad(key, why);
  }
  void set_class(std::string name) { class_name_ = std::move(name); }
  const std::string& file() const { return file_; }

 private:
  std::int64_t checked_integer(const std::string& key, const Json& value, std::int64_t low,
                               std::int64_t high) const {
    if (!value.is_number_integer() || value.get<std::int64_t>() < low ||
        value.get<std::int64_t>() > high) {
      throw bad(key,
                fmt::format("is {}, not an integer in [{}, {}]", json_excerpt(value), low, high));
    }
    return value.get<std::int64_t>();
  }

  const Json& config_;
  const std::string& file_;
  std::string class_name_;
};

nn::DecoderConfig parse_gpt2(const ConfigReader& c) {
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
  return gpt;
}

/// RoPE's theta from any of its spellings: transformers 4's top-level `rope_theta` and
/// `rope_scaling`, transformers 5's `rope_parameters {rope_type, rope_theta}`. They must agree,
/// and the type must be the plain rotation ("default").
double rope_theta(const ConfigReader& c) {
  std::optional<double> theta;
  std::string source;
  const auto take = [&](double value, const std::string& from) {
    if (theta && *theta != value) {
      throw c.bad(from, fmt::format("gives RoPE theta {} but {} gives {}: which one the model "
                                    "was trained with is unknown",
                                    value, source, *theta));
    }
    theta = value;
    source = from;
  };
  if (c.has("rope_theta")) take(c.number("rope_theta", kDefaultRopeTheta), "rope_theta");
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    if (!c.has(key)) continue;
    const Json& spec = c.at(key);
    if (!spec.is_object())
      throw c.bad(key, fmt::format("is {}, not an object", json_excerpt(spec)));
    std::string type = "default";
    for (const char* name : {"rope_type", "type"}) {
      if (!spec.contains(name)) continue;
      if (!spec[name].is_string())
        throw c.bad(key, fmt::format("has {} {}, not a string", name, json_excerpt(spec[name])));
      type = spec[name].get<std::string>();
    }
    if (type != "default") {
      throw c.bad(key, fmt::format("has rope_type '{}': meshtensor computes the plain rotation "
                                   "(rope_type 'default') only",
                                   type));
    }
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
      take(value.get<double>(), std::string(key) + ".rope_theta");
    }
  }
  return theta.value_or(kDefaultRopeTheta);
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

nn::DecoderConfig parse_llama(ConfigReader& c, bool qwen3) {
  c.set_class(qwen3 ? "Qwen3Config" : "LlamaConfig");
  const std::int64_t dim = c.integer("hidden_size", 4096, 1, 8192);
  const std::int64_t heads = c.integer("num_attention_heads", 32, 1, 256);
  const std::int64_t kv_heads = c.integer("num_key_value_heads", qwen3 ? 32 : heads, 1, 256);
  const std::int64_t layers = c.integer("num_hidden_layers", 32, 1, 256);
  const std::int64_t context = c.integer("max_position_embeddings", qwen3 ? 32768 : 2048, 1, 8192);
  const std::int64_t head_dim = c.integer("head_dim", qwen3 ? 128 : dim / heads, 1, 8192);
  c.require("head_dim", head_dim * heads == dim,
            fmt::format("is {}{}, but hidden_size / num_attention_heads is {}: meshtensor's "
                        "heads are hidden_size / num_attention_heads wide",
                        head_dim,
                        c.has("head_dim")
                            ? ""
                            : fmt::format(" ({}'s default)", qwen3 ? "Qwen3Config" : "LlamaConfig"),
                        dim / heads));
  const double theta = rope_theta(c);
  const std::string act = c.text("hidden_act", "silu");
  c.require("hidden_act", act == "silu" || act == "swish",  // one function in transformers
            fmt::format("is '{}': the Llama family's MLP is SwiGLU (silu)", act));
  c.require("attention_bias", !c.flag("attention_bias", false), "is true: the Llama has no biases");
  c.require("mlp_bias", !c.flag("mlp_bias", false), "is true: the Llama has no biases");
  if (qwen3) check_sliding_window(c, layers, context);
  if (!qwen3) {
    c.require("use_sliding_window", !c.flag("use_sliding_window", false),
              "is true: LlamaConfig has no sliding window");
  }
  c.integer("pretraining_tp", 1, 1, 1 << 20);  // inert: the same products, split or not
  const std::string text = fmt::format(
      "llama:layers={},heads={},kv_heads={},dim={},ffn={},context={},rope_theta={},norm_eps={},"
      "qk_norm={},tie={}",
      layers, heads, kv_heads, dim, c.integer("intermediate_size", qwen3 ? 22016 : 11008, 1, 65536),
      context, theta, c.number("rms_norm_eps", 1e-6), qwen3 ? 1 : 0,
      c.flag("tie_word_embeddings", false) ? 1 : 0);
  nn::LlamaConfig llama;
  try {
    llama = nn::parse_llama_config(text);
  } catch (const Error& e) {
    throw DataError(fmt::format("{}: {}", c.file(), e.what()));
  }
  llama.vocabulary = c.integer("vocab_size", qwen3 ? 151936 : 32000, 1, nn::kMaxVocabulary);
  return llama;
}

/// The class a config.json names in "architectures" (one string), checked against its
/// "model_type" when that is given.
std::string config_class(const Json& config, const std::string& file) {
  std::string architecture;
  if (config.contains("architectures") && config["architectures"].is_array() &&
      config["architectures"].size() == 1 && config["architectures"][0].is_string()) {
    architecture = config["architectures"][0].get<std::string>();
  }
  // A base model's folder (GPT2Model, ...) holds the same tensors without the head: read as
  // the head class, whose head is the token table when tied (else its lm_head is missing).
  static const std::map<std::string, std::string> kBaseModels = {
      {"GPT2Model", "GPT2LMHeadModel"},
      {"LlamaModel", "LlamaForCausalLM"},
      {"Qwen3Model", "Qwen3ForCausalLM"}};
  if (const auto base = kBaseModels.find(architecture); base != kBaseModels.end())
    architecture = base->second;
  static const std::map<std::string, std::string> kModelTypes = {
      {"GPT2LMHeadModel", "gpt2"}, {"LlamaForCausalLM", "llama"}, {"Qwen3ForCausalLM", "qwen3"}};
  const auto known = kModelTypes.find(architecture);
  if (known == kModelTypes.end()) {
    const std::string named = !architecture.empty() ? "'" + architecture + "'"
                              : config.contains("architectures")
                                  ? json_excerpt(config["architectures"])
                                  : "(none given)";
    throw DataError(fmt::format(
        "{}: architecture {} is not GPT2LMHeadModel, LlamaForCausalLM or Qwen3ForCausalLM", file,
        named));
  }
  if (config.contains("model_type") && config["model_type"] != known->second) {
    throw DataError(
        fmt::format("{}: \"model_type\" is {} but the architecture {} is model_type "
                    "'{}': the folder describes two models",
                    file, json_excerpt(config["model_type"]), architecture, known->second));
  }
  return architecture;
}

}  // namespace

std::string architecture_of(const nn::DecoderConfig& config) {
  if (const auto* gpt = std::get_if<nn::GptConfig>(&config)) {
    if (!gpt->tie) {
      throw InvalidArgument(fmt::format(
          "model {} has a head of its own with a bias; GPT2LMHeadModel's head is the token "
          "table without one: train the GPT with tie=1 to export it",
          nn::gpt_config_text(*gpt)));
    }
    return "GPT2LMHeadModel";
  }
  return std::get<nn::LlamaConfig>(config).qk_norm ? "Qwen3ForCausalLM" : "LlamaForCausalLM";
}

std::pair<Json, Json> bos_eos(const tokenize::Tokenizer& tokenizer) {
  const auto id = [&](std::string_view content) -> Json {
    for (const tokenize::AddedToken& token : tokenizer.added_tokens())
      if (token.content == content) return token.id;
    return nullptr;
  };
  Json bos = id("<|begin_of_text|>");
  Json eos = id("<|end_of_text|>");
  if (bos.is_null()) bos = id("<|endoftext|>");
  if (eos.is_null()) eos = id("<|endoftext|>");
  return {bos, eos};
}

Json config_json(const nn::DecoderConfig& config, const tokenize::Tokenizer& tokenizer,
                 DType dtype) {
  const auto [bos, eos] = bos_eos(tokenizer);
  Json out = {{"architectures", {architecture_of(config)}},
              {"bos_token_id", bos},
              {"eos_token_id", eos},
              {"torch_dtype", dtype == DType::bf16  ? "bfloat16"
                              : dtype == DType::f16 ? "float16"
                                                    : "float32"},
              {"vocab_size", nn::decoder_vocabulary(config)}};
  if (const auto* gpt = std::get_if<nn::GptConfig>(&config)) {
    out.update({{"model_type", "gpt2"},
                {"n_layer", gpt->layers},
                {"n_head", gpt->heads},
                {"n_embd", gpt->dim},
                {"n_positions", gpt->context},
                {"n_ctx", gpt->context},
                {"n_inner", nullptr},
                {"activation_function", "gelu_new"},
                {"layer_norm_epsilon", kGpt2LayerNormEps},
                {"resid_pdrop", 0.0},
                {"embd_pdrop", 0.0},
                {"attn_pdrop", 0.0},
                {"initializer_range", gpt->init_std},
                {"scale_attn_weights", true},
                {"tie_word_embeddings", true}});
    return out;
  }
  const auto& llama = std::get<nn::LlamaConfig>(config);
  out.update({{"model_type", llama.qk_norm ? "qwen3" : "llama"},
              {"hidden_size", llama.dim},
              {"intermediate_size", llama.ffn},
              {"num_hidden_layers", llama.layers},
              {"num_attention_heads", llama.heads},
              {"num_key_value_heads", llama.kv_heads},
              {"head_dim", llama.dim / llama.heads},
              {"max_position_embeddings", llama.context},
              {"rms_norm_eps", llama.norm_eps},
              {"rope_theta", llama.rope_theta},
              {"rope_scaling", nullptr},
              {"hidden_act", "silu"},
              {"attention_bias", false},
              {"mlp_bias", false},
              {"initializer_range", llama.init_std},
              {"tie_word_embeddings", llama.tie}});
  if (llama.qk_norm) out.update({{"use_sliding_window", false}, {"sliding_window", nullptr}});
  return out;
}

nn::DecoderConfig parse_config_json(const Json& config, const std::string& file) {
  const std::string architecture = config_class(config, file);
  ConfigReader reader(config, file);
  if (architecture == "GPT2LMHeadModel") {
    reader.set_class("GPT2Config");
    return parse_gpt2(reader);
  }
  return parse_llama(reader, architecture == "Qwen3ForCausalLM");
}

}  // namespace meshtensor::hf
