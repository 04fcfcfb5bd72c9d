#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <meshtensor/nn/decoder.hpp>
#include <meshtensor/nn/gpt.hpp>
#include <meshtensor/nn/llama.hpp>

namespace meshtensor::nn {

/// True for a model text of a decoder family ("gpt", "gpt:...", "llama", "llama:...").
bool is_decoder_model(const std::string& text);

/// The config a "gpt..." or "llama..." text names (parse_gpt_config, parse_llama_config);
/// ParseError naming the text for another family.
DecoderSpec parse_decoder_spec(const std::string& text);

/// The text parse_decoder_spec reads back.
std::string decoder_spec_text(const DecoderSpec& config);

/// Largest vocabulary a decoder's architecture may name.
inline constexpr std::int64_t kMaxVocabulary = std::int64_t{1} << 24;

/// The "architecture" metadata of a decoder of `config` reading tokens of the tokenizer named
/// `tokenizer`, as `meshtensor train` writes it: the family, then its keys as key=value words,
/// the vocabulary and the tokenizer ("gpt layers=4 heads=4 dim=128 context=128 vocabulary=256
/// tokenizer=bytes", "llama layers=4 heads=4 kv_heads=2 ... vocabulary=8192
/// tokenizer=bpe:0123456789abcdef").
std::string decoder_architecture_text(const DecoderSpec& config,
                                      const std::string& tokenizer = "bytes");

/// The decoder a checkpoint's "architecture" metadata describes; DataError naming the text when
/// it is not a decoder of a known family, its keys do not parse, or it names no tokenizer.
DecoderSpec parse_decoder_architecture(const std::string& text);

/// The tokenizer an architecture text names (its "tokenizer=" word), or empty.
std::string architecture_tokenizer(const std::string& text);

/// `config` with a vocabulary of `vocabulary` tokens.
DecoderSpec with_vocabulary(DecoderSpec config, std::int64_t vocabulary);

/// Bytes the model of `config` allocates when built (its parameters' values and gradients).
double decoder_model_bytes(const DecoderSpec& config);

/// `config` with a context of `context` positions.
DecoderSpec with_context(DecoderSpec config, std::int64_t context);

/// `config` with its initial weights drawn from `seed`.
DecoderSpec with_seed(DecoderSpec config, std::uint64_t seed);

/// The model `config` builds (the same bits everywhere for the same config).
std::unique_ptr<Decoder> make_decoder(const DecoderSpec& config);

}  // namespace meshtensor::nn
