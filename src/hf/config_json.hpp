#pragma once

#include <utility>

#include <nlohmann/json.hpp>

#include <meshtensor/tokenize/tokenizer.hpp>

namespace meshtensor::hf {

/// The ids Hugging Face's configs name as beginning and end of text: GPT-2's <|endoftext|> is
/// both, Llama 3's <|begin_of_text|> and <|end_of_text|>; null when the tokenizer has neither.
std::pair<nlohmann::json, nlohmann::json> bos_eos(const tokenize::Tokenizer& tokenizer);

}  // namespace meshtensor::hf
