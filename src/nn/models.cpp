#include <fmt/format.h>

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

std::unique_ptr<Decoder> make_decoder(const DecoderConfig& config) {
  if (const auto* gpt = std::get_if<GptConfig>(&config)) return std::make_unique<Gpt>(*gpt);
  return std::make_unique<Llama>(std::get<LlamaConfig>(config));
}

}  // namespace meshtensor::nn
