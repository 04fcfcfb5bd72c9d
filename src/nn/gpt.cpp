#include <cmath>
#include <map>
#include <sstream>

#include <fmt/format.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/core/memory.hpp>
#include <meshtensor/core/random.hpp>
#include <meshtensor/core/shape.hpp>
#include <meshtensor/nn/gpt.hpp>
#include <meshtensor/nn/models.hpp>

namespace meshtensor::nn {

namespace {

constexpr std::string_view kGptUsage = "gpt or gpt:layers=L,heads=H,dim=D,context=T,tie=0|1";

}  // namespace

bool is_gpt_model(const std::string& text) {
  return text == "gpt" || text.rfind("gpt:", 0) == 0;
}

GptConfig parse_gpt_config(const std::string& text) {
  GptConfig config;
  if (text == "gpt") return config;
  constexpr std::string_view kPrefix = "gpt:";
  if (text.rfind(kPrefix, 0) != 0)
    throw ParseError(fmt::format("unknown model '{}' (expected {})", text, kGptUsage));
  // The preset's keys, with the spec's ranges; tie is 0 or 1.
  DecoderSpec spec = gpt_spec(config);
  std::int64_t tie = 0;
  std::map<std::string_view, bool> seen;
  for (std::string_view part : split(std::string_view(text).substr(kPrefix.size()), ',')) {
    const auto equals = part.find('=');
    const std::string_view key = part.substr(0, equals);
    const bool known =
        key == "layers" || key == "heads" || key == "dim" || key == "context" || key == "tie";
    if (equals == std::string_view::npos || !known) {
      throw ParseError(
          fmt::format("'{}' in model '{}' is not one of layers=, heads=, dim=, "
                      "context=, tie= (expected {})",
                      part, text, kGptUsage));
    }
    if (seen[key]) throw ParseError(fmt::format("model '{}' gives {} twice", text, key));
    seen[key] = true;
    std::int64_t* target = key == "tie" ? &tie : decoder_integer_key(spec, key);
    const std::int64_t value =
        parse_count(part.substr(equals + 1), key == "tie" ? 1 : decoder_key_limit(key),
                    fmt::format("model '{}'", text));
    if (value == 0 && target != &tie)
      throw ParseError(fmt::format("{} in model '{}' must be positive", part, text));
    *target = value;
  }
  config.layers = spec.layers;
  config.heads = spec.heads;
  config.dim = spec.dim;
  config.context = spec.context;
  config.tie = tie == 1;
  if (config.dim % config.heads != 0) {
    throw ParseError(fmt::format("model '{}': dim {} does not split into {} heads", text,
                                 config.dim, config.heads));
  }
  return config;
}

std::string gpt_config_text(const GptConfig& config) {
  return fmt::format("gpt:layers={},heads={},dim={},context={}{}", config.layers, config.heads,
                     config.dim, config.context, config.tie ? ",tie=1" : "");
}

std::string architecture_text(const GptConfig& config, const std::string& tokenizer) {
  return fmt::format("gpt layers={} heads={} dim={} context={}{} vocabulary={} tokenizer={}",
                     config.layers, config.heads, config.dim, config.context,
                     config.tie ? " tie=1" : "", config.vocabulary, tokenizer);
}

GptConfig parse_architecture(const std::string& text) {
  const auto bad = [&](const std::string& why) {
    return DataError(fmt::format("architecture '{}' is not a GPT's ({})", text, why));
  };
  std::istringstream words(text);
  std::string kind;
  words >> kind;
  if (kind != "gpt") throw bad("it is not a gpt");
  std::map<std::string, std::string> fields;
  for (std::string word; words >> word;) {
    const auto equals = word.find('=');
    if (equals == std::string::npos) throw bad(fmt::format("'{}' is not key=value", word));
    fields[word.substr(0, equals)] = word.substr(equals + 1);
  }
  if (fields["tokenizer"].empty()) throw bad("it names no tokenizer");
  GptConfig config;
  const auto number = [&](const char* key) {
    try {
      std::size_t used = 0;
      const long long value = std::stoll(fields.at(key), &used);
      if (used != fields.at(key).size() || value < 1) throw bad(key);
      return static_cast<std::int64_t>(value);
    } catch (const std::logic_error&) {
      throw bad(fmt::format("no positive {}", key));
    }
  };
  config.layers = number("layers");
  config.heads = number("heads");
  config.dim = number("dim");
  config.context = number("context");
  config.vocabulary = number("vocabulary");
  if (fields.count("tie") != 0) {
    if (fields["tie"] != "0" && fields["tie"] != "1") throw bad("tie '" + fields["tie"] + "'");
    config.tie = fields["tie"] == "1";
  }
  if (config.vocabulary > kMaxVocabulary)
    throw bad(fmt::format("vocabulary {} is more than {}", config.vocabulary, kMaxVocabulary));
  // The command line's ranges and checks, through its parser.
  try {
    const std::int64_t vocabulary = config.vocabulary;
    config = nn::parse_gpt_config(nn::gpt_config_text(config));
    config.vocabulary = vocabulary;
  } catch (const Error& e) {
    throw bad(e.what());
  }
  return config;
}

std::int64_t gpt_parameter_count(const GptConfig& config) {
  return decoder_parameter_count(gpt_spec(config));
}

double gpt_model_bytes(const GptConfig& config) {
  return 2.0 * 4.0 * static_cast<double>(gpt_parameter_count(config));  // values and gradients
}

DecoderSpec gpt_spec(const GptConfig& config) {
  DecoderSpec spec;
  spec.family = DecoderFamily::gpt;
  spec.layers = config.layers;
  spec.heads = config.heads;
  spec.kv_heads = config.heads;
  spec.dim = config.dim;
  spec.ffn = 4 * config.dim;
  spec.context = config.context;
  spec.vocabulary = config.vocabulary;
  spec.norm = NormKind::layer_norm;
  spec.positions = PositionKind::learned;
  spec.mlp = MlpKind::gelu;
  spec.qkv_bias = true;
  spec.out_bias = true;
  spec.mlp_bias = true;
  spec.head_bias = true;
  spec.tie = config.tie;
  spec.seed = config.seed;
  spec.init_std = config.init_std;
  return spec;
}

GptConfig::operator DecoderSpec() const {
  return gpt_spec(*this);
}

GptConfig gpt_config_of(const DecoderSpec& spec) {
  const GptConfig config{spec.layers,     spec.heads, spec.dim,  spec.context,
                         spec.vocabulary, spec.tie,   spec.seed, spec.init_std};
  if (spec.family != DecoderFamily::gpt || gpt_spec(config) != spec) {
    throw InvalidArgument(
        fmt::format("a spec of heads {}, kv_heads {}, dim {}, ffn {} is not a GPT preset's",
                    spec.heads, spec.kv_heads, spec.dim, spec.ffn));
  }
  return config;
}

}  // namespace meshtensor::nn
