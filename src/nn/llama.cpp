#include <cmath>
#include <map>

#include <fmt/format.h>

#include <meshtensor/core/error.hpp>
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
    scaling.original_context = integer_setting(what + " original context", std::string(parts[4]), 1,
                                               decoder_key_limit("context"));
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
bool set_llama_key(DecoderSpec& config, std::string_view key, const std::string& value,
                   const std::string& what) {
  if (std::int64_t* field = decoder_integer_key(config, key); field != nullptr) {
    *field = integer_setting(what, value, 1, decoder_key_limit(key));
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
void check_llama_shape(const DecoderSpec& c, const std::string& text) {
  if (const std::string problem = decoder_spec_problem(c); !problem.empty())
    throw ParseError(fmt::format("model '{}': {}", text, problem));
}

}  // namespace

bool is_llama_model(const std::string& text) {
  return text == "llama" || text.rfind("llama:", 0) == 0;
}

DecoderSpec parse_llama_config(const std::string& text) {
  DecoderSpec config;
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

std::string llama_config_text(const DecoderSpec& c) {
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

}  // namespace meshtensor::nn
