#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <variant>

#include <meshtensor/nn/decoder.hpp>
#include <meshtensor/nn/gpt.hpp>
#include <meshtensor/nn/llama.hpp>

namespace meshtensor::nn {

/// A decoder's config, by family.
using DecoderConfig = std::variant<GptConfig, LlamaConfig>;

/// True for a model text of a decoder family ("gpt", "gpt:...", "llama", "llama:...").
bool is_decoder_model(const std::string& text);

/// The config a "gpt..." or "llama..." text names (parse_gpt_config, parse_llama_config);
/// ParseError naming the text for another family.
DecoderConfig parse_decoder_config(const std::string& text);

/// The text parse_decoder_config reads back.
std::string decoder_config_text(const DecoderConfig& config);

/// Parameters of the model `config` builds.
std::int64_t decoder_parameter_count(const DecoderConfig& config);

/// The model `config` builds (the same bits everywhere for the same config).
std::unique_ptr<Decoder> make_decoder(const DecoderConfig& config);

}  // namespace meshtensor::nn
