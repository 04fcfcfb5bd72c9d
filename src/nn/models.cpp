#include <algorithm>
#include <charconv>
#include <sstream>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/nn/models.hpp>

namespace meshtensor::nn {

bool is_decoder_model(const std::string& text) {
  return is_gpt_model(text) || is_llama_model(text);
}

DecoderConfig parse_decoder_config(const std::string& text) {
  if (is_gpt_model(text)) return parse_gpt_config(text);
  if (is_llama_model(text)) return parse_llama_config(text);
  throw ParseError(fmt::format(
      "model '{}' is not a decoder: expected gpt[:layers=L,...] or llama[:layers=L,...]", text));
}

std::string decoder_config_text(const DecoderConfig& config) {
  if (const auto* gpt = std::get_if<GptConfig>(&config)) return gpt_config_text(*gpt);
  return llama_config_text(std::get<LlamaConfig>(config));
}

std::int64_t decoder_parameter_count(const DecoderConfig& config) {
  if (const auto* gpt = std::get_if<GptConfig>(&config)) return gpt_parameter_count(*gpt);
  return llama_parameter_count(std::get<LlamaConfig>(config));
}

std::string decoder_architecture_text(const DecoderConfig& config, const std::string& tokenizer) {
  if (const auto* gpt = std::get_if<GptConfig>(&config)) return architecture_text(*gpt, tokenizer);
  const auto& llama = std::get<LlamaConfig>(config);
  std::string keys = llama_config_text(llama).substr(6);  // after "llama:"
  std::replace(keys.begin(), keys.end(), ',', ' ');
  return fmt::format("llama {} vocabulary={} tokenizer={}", keys, llama.vocabulary, tokenizer);
}

std::string architecture_tokenizer(const std::string& text) {
  std::istringstream words(text);
  for (std::string word; words >> word;)
    if (word.rfind("tokenizer=", 0) == 0) return word.substr(10);
  return {};
}

DecoderConfig with_vocabulary(DecoderConfig config, std::int64_t vocabulary) {
  std::visit([vocabulary](auto& c) { c.vocabulary = vocabulary; }, config);
  return config;
}

namespace {

/// The Llama of a "llama k=v ... vocabulary=V tokenizer=NAME" architecture text.
LlamaConfig parse_llama_architecture(const std::string& text) {
  std::istringstream words(text);
  std::string word;
  words >> word;  // "llama"
  std::vector<std::string> keys;
  std::string vocabulary;
  std::string tokenizer;
  while (words >> word) {
    if (word.rfind("vocabulary=", 0) == 0) {
      vocabulary = word.substr(11);
    } else if (word.rfind("tokenizer=", 0) == 0) {
      tokenizer = word.substr(10);
    } else {
      keys.push_back(word);
    }
  }
  const auto bad = [&](const std::string& why) {
    return DataError(fmt::format("architecture '{}' is not a Llama's ({})", text, why));
  };
  if (tokenizer.empty()) throw bad("it names no tokenizer");
  std::int64_t tokens = 0;
  const auto [end, problem] =
      std::from_chars(vocabulary.data(), vocabulary.data() + vocabulary.size(), tokens);
  if (problem != std::errc() || end != vocabulary.data() + vocabulary.size() || tokens < 1 ||
      tokens > kMaxVocabulary) {
    throw bad(fmt::format("vocabulary '{}' is not between 1 and {}", vocabulary, kMaxVocabulary));
  }
  try {
    LlamaConfig config = parse_llama_config(fmt::format("llama:{}", fmt::join(keys, ",")));
    config.vocabulary = tokens;
    return config;
  } catch (const ParseError& e) {
    throw bad(e.what());
  }
}

}  // namespace

DecoderConfig parse_decoder_architecture(const std::string& text) {
  const std::string family = text.substr(0, text.find(' '));
  if (family == "llama") return parse_llama_architecture(text);
  if (family == "gpt") return parse_architecture(text);
  throw DataError(
      fmt::format("architecture '{}' is not a decoder's: its family '{}' is neither gpt nor llama",
                  text, family));
}

double decoder_model_bytes(const DecoderConfig& config) {
  return 2.0 * 4.0 * static_cast<double>(decoder_parameter_count(config));
}

std::string decoder_family(const DecoderConfig& config) {
  return std::holds_alternative<GptConfig>(config) ? "gpt" : "llama";
}

std::int64_t decoder_context(const DecoderConfig& config) {
  return std::visit([](const auto& c) { return c.context; }, config);
}

std::int64_t decoder_layers(const DecoderConfig& config) {
  return std::visit([](const auto& c) { return c.layers; }, config);
}

std::int64_t decoder_dim(const DecoderConfig& config) {
  return std::visit([](const auto& c) { return c.dim; }, config);
}

std::int64_t decoder_vocabulary(const DecoderConfig& config) {
  return std::visit([](const auto& c) { return c.vocabulary; }, config);
}

bool decoder_tied(const DecoderConfig& config) {
  return std::visit([](const auto& c) { return c.tie; }, config);
}

DecoderConfig with_context(DecoderConfig config, std::int64_t context) {
  std::visit([context](auto& c) { c.context = context; }, config);
  return config;
}

DecoderConfig with_seed(DecoderConfig config, std::uint64_t seed) {
  std::visit([seed](auto& c) { c.seed = seed; }, config);
  return config;
}

std::unique_ptr<Decoder> make_decoder(const DecoderConfig& config) {
  if (const auto* gpt = std::get_if<GptConfig>(&config)) return std::make_unique<Gpt>(*gpt);
  return std::make_unique<Llama>(std::get<LlamaConfig>(config));
}

}  // namespace meshtensor::nn
