#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include <meshtensor/tokenize/tokenizer.hpp>

namespace meshtensor::hf {

/// Applies a folder's tokenizer configs to `tokenizer`, as transformers and vLLM read them
/// (null for a file the folder lacks; `*_file` names each in errors):
/// - tokenizer_config.json: bos_token, eos_token, pad_token (text, or an object with
///   "content"); add_bos_token / add_eos_token, where given, decide the tokens put around a text
///   (bos first, eos last; the template of tokenizer.json otherwise); added_tokens_decoder marks
///   its tokens special or not, and must name each by its id in the tokenizer;
/// - chat_template: a template's text, or the one named "default" of a list of named templates
///   (`chat_template_file`, a folder's chat_template.jinja, takes its place where given);
/// - the end of a generated sequence: every eos_token_id of generation_config.json (one id or a
///   list), or config.json's where the folder has no generation_config.json, then the
///   tokenizer's eos_token.
/// DataError naming the file and the field for a token the tokenizer lacks, an id outside it, an
/// add_bos_token without a bos_token, a field of another type.
void apply_tokenizer_configs(tokenize::Tokenizer& tokenizer, const nlohmann::json& tokenizer_config,
                             const std::string& tokenizer_config_file,
                             const nlohmann::json& generation_config,
                             const std::string& generation_config_file,
                             const nlohmann::json& model_config,
                             const std::string& model_config_file,
                             const std::string* chat_template_file = nullptr);

/// The tokenizer_config.json an export writes: the roles of the special tokens, add_bos_token /
/// add_eos_token where the post-processor puts one token first / last (or none), every added
/// token, the chat template, `context` as model_max_length.
nlohmann::json tokenizer_config_json(const tokenize::Tokenizer& tokenizer, std::int64_t context);

/// The generation_config.json an export writes: the bos id, the end ids (one, a list, or null).
nlohmann::json generation_config_json(const tokenize::Tokenizer& tokenizer, std::int64_t context);

}  // namespace meshtensor::hf
