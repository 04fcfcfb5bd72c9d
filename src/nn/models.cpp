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

DecoderSpec parse_decoder_spec(const std::string& text) {
  if (is_gpt_model(text)) return gpt_spec(parse_gpt_config(text));
  if (is_llama_model(text)) return parse_llama_config(text);
  throw ParseError(fmt::format(
      "model '{}' is not a decoder: expected gpt[:layers=L,...] or llama[:layers=L,...]", text));
}

std::string decoder_spec_text(const DecoderSpec& spec) {
  if (spec.family == DecoderFamily::gpt) return gpt_config_text(gpt_config_of(spec));
  return llama_config_text(spec);
}

std::string decoder_architecture_text(const DecoderSpec& spec, const std::string& tokenizer) {
  if (spec.family == DecoderFamily::gpt) return architecture_text(gpt_config_of(spec), tokenizer);
  std::string keys = llama_config_text(spec).substr(6);  // after "llama:"
  std::replace(keys.begin(), keys.end(), ',', ' ');
  return fmt::format("llama {} vocabulary={} tokenizer={}", keys, spec.vocabulary, tokenizer);
}

std::string architecture_tokenizer(const std::string& text) {
  std::istringstream words(text);
  for (std::string word; words >> word;)
    if (word.rfind("tokenizer=", 0) == 0) return word.substr(10);
  return {};
}

namespace {

/// The Llama of a "llama k=v ... vocabulary=V tokenizer=NAME" architecture text.
DecoderSpec parse_llama_architecture(const std::string& text) {
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
    DecoderSpec config = parse_llama_config(fmt::format("llama:{}", fmt::join(keys, ",")));
    config.vocabulary = tokens;
    return config;
  } catch (const ParseError& e) {
    throw bad(e.what());
  }
}

}  // namespace

DecoderSpec parse_decoder_architecture(const std::string& text) {
  const std::string family = text.substr(0, text.find(' '));
  if (family == "llama") return parse_llama_architecture(text);
  if (family == "gpt") return gpt_spec(parse_architecture(text));
  throw DataError(
      fmt::format("architecture '{}' is not a decoder's: its family '{}' is neither gpt nor llama",
                  text, family));
}

double decoder_model_bytes(const DecoderSpec& spec) {
  return 2.0 * 4.0 * static_cast<double>(decoder_parameter_count(spec));
}

DecoderSpec with_vocabulary(DecoderSpec spec, std::int64_t vocabulary) {
  spec.vocabulary = vocabulary;
  return spec;
}

DecoderSpec with_context(DecoderSpec spec, std::int64_t context) {
  spec.context = context;
  return spec;
}

DecoderSpec with_seed(DecoderSpec spec, std::uint64_t seed) {
  spec.seed = seed;
  return spec;
}

std::unique_ptr<Decoder> make_decoder(const DecoderSpec& spec) {
  if (spec.family == DecoderFamily::gpt) return std::make_unique<Gpt>(gpt_config_of(spec));
  return std::make_unique<TransformerDecoder>(spec);
}

}  // namespace meshtensor::nn
