#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

#include <fmt/format.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/core/untrusted_json.hpp>
#include <meshtensor/core/utf8.hpp>
#include <meshtensor/serve/api.hpp>

#include "request_fields.hpp"

namespace meshtensor::serve {

namespace {

using nlohmann::json;

const std::set<std::string>& known_fields() {
  static const std::set<std::string> fields{"model",
                                            "prompt",
                                            "max_tokens",
                                            "temperature",
                                            "top_p",
                                            "top_k",
                                            "seed",
                                            "n",
                                            "stop",
                                            "logprobs",
                                            "echo",
                                            "stream",
                                            "suffix",
                                            "best_of",
                                            "user",
                                            "logit_bias",
                                            "stream_options",
                                            "presence_penalty",
                                            "frequency_penalty"};
  return fields;
}

std::vector<std::int64_t> token_prompt(const json& tokens, std::size_t index,
                                       const nn::DecoderSpec& config) {
  if (tokens.size() > static_cast<std::size_t>(config.context)) {
    throw bad("prompt", fmt::format("prompt {} is {} tokens, but the model's context is {}", index,
                                    tokens.size(), config.context));
  }
  std::vector<std::int64_t> prompt;
  for (const json& token : tokens) {
    const std::string key = fmt::format("prompt[{}]", index);
    prompt.push_back(integer_value(token, key, 0, config.vocabulary - 1));
  }
  return prompt;
}

/// string | [string, ...] | [token, ...] | [[token, ...], ...]
std::vector<std::vector<std::int64_t>> parse_prompts(const json& doc, const nn::DecoderSpec& config,
                                                     const tokenize::Tokenizer& tokenizer) {
  const json* value = field(doc, "prompt");
  if (value == nullptr) throw bad("prompt", "'prompt' is required");
  std::vector<std::vector<std::int64_t>> prompts;
  if (value->is_string()) {
    prompts.push_back(tokenizer.encode_with_specials(value->get<std::string>()));
  } else if (value->is_array() && !value->empty()) {
    const json& first = value->front();
    for (std::size_t i = 0; i < value->size(); ++i) {
      const json& item = (*value)[i];
      if (first.is_number() && item.is_number()) continue;
      if (item.is_string() && first.is_string()) {
        prompts.push_back(tokenizer.encode_with_specials(item.get<std::string>()));
      } else if (item.is_array() && first.is_array()) {
        prompts.push_back(token_prompt(item, i, config));
      } else {
        throw bad("prompt", fmt::format("'prompt' must be a string, a list of strings, a list of "
                                        "token ids or a list of lists of them; item {} is {}",
                                        i, excerpt(item)));
      }
    }
    if (first.is_number()) prompts.push_back(token_prompt(*value, 0, config));
  } else {
    throw bad("prompt", fmt::format("'prompt' must be a string, a list of strings, a list of "
                                    "token ids or a list of lists of them, got {}",
                                    excerpt(*value)));
  }
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    if (prompts[i].empty())
      throw bad("prompt", fmt::format("prompt {} is empty: give at least one token", i));
    if (static_cast<std::int64_t>(prompts[i].size()) >= config.context) {
      throw bad("prompt", fmt::format("prompt {} is {} tokens, but the model's context is {} "
                                      "(it must leave room for a new token)",
                                      i, prompts[i].size(), config.context));
    }
  }
  return prompts;
}

std::int64_t parse_max_tokens(const json& doc, const CompletionParams& params,
                              const nn::DecoderSpec& config) {
  std::int64_t longest = 0;
  for (const auto& prompt : params.prompts)
    longest = std::max<std::int64_t>(longest, static_cast<std::int64_t>(prompt.size()));
  const std::int64_t room = config.context - longest;
  const json* value = field(doc, "max_tokens");
  if (value == nullptr) return std::min<std::int64_t>(16, room);
  const std::int64_t max_tokens =
      integer_value(*value, "max_tokens", 1, std::numeric_limits<std::int64_t>::max());
  if (max_tokens > room) {
    throw bad("max_tokens",
              fmt::format("'max_tokens': {} new tokens after a prompt of {} tokens is more than "
                          "the model's context of {} (at most {} here)",
                          max_tokens, longest, config.context, room));
  }
  return max_tokens;
}

/// Completions fields the server takes only at their neutral values.
void check_completion_only_fields(const json& doc, std::int64_t n) {
  check_neutral_fields(doc);
  if (const json* value = field(doc, "best_of");
      value && integer_value(*value, "best_of", 1, 1 << 20) != n) {
    throw bad("best_of", fmt::format("'best_of' {} is not supported: give n choices instead",
                                     excerpt(*value)));
  }
  if (const json* value = field(doc, "suffix"); value && *value != "")
    throw bad("suffix", "'suffix' is not supported");
}

void parse_output_options(const json& doc, CompletionParams& params, const ApiLimits& limits) {
  if (const json* v = field(doc, "logprobs"))
    params.logprobs = integer_value(*v, "logprobs", 0, limits.max_top_logprobs);
  if (const json* v = field(doc, "echo")) params.echo = bool_value(*v, "echo");
  parse_stream(doc, params);
}

}  // namespace

Json error_body(const ApiError& error) {
  Json inner;
  inner["message"] = error.message;
  inner["type"] = error.type;
  inner["param"] = error.param.empty() ? Json() : Json(error.param);
  inner["code"] = error.code.empty() ? Json() : Json(error.code);
  Json out;
  out["error"] = std::move(inner);
  return out;
}

CompletionParams parse_completion_request(std::string_view body, const std::string& model_name,
                                          const nn::DecoderSpec& config,
                                          std::shared_ptr<const tokenize::Tokenizer> tokenizer,
                                          const ApiLimits& limits, std::uint64_t default_seed) {
  const json doc = parse_body(body, known_fields());
  check_model(doc, model_name);
  CompletionParams params;
  params.tokenizer = std::move(tokenizer);
  params.prompts = parse_prompts(doc, config, *params.tokenizer);
  if (const json* v = field(doc, "n")) params.n = integer_value(*v, "n", 1, limits.max_choices);
  const auto choices = static_cast<std::int64_t>(params.prompts.size()) * params.n;
  if (choices > limits.max_choices) {
    throw bad("n", fmt::format("{} prompts × n {} is {} choices; at most {} are allowed",
                               params.prompts.size(), params.n, choices, limits.max_choices));
  }
  params.max_tokens = parse_max_tokens(doc, params, config);
  params.stop = parse_stop(doc, limits);
  check_completion_only_fields(doc, params.n);
  parse_sampling(doc, params, default_seed);
  parse_output_options(doc, params, limits);
  for (std::size_t i = 0; i < params.prompts.size(); ++i) {
    try {
      generate::check_request({params.prompts[i], params.max_tokens, params.sampling}, i, config);
    } catch (const Error& e) {
      throw bad("", e.what());
    }
  }
  return params;
}

namespace {

/// The bytes of generated tokens [first, end).
std::string token_text(std::span<const generate::ScoredToken> tokens, std::size_t first,
                       std::size_t end, const tokenize::Tokenizer& tokenizer) {
  std::string bytes;
  for (std::size_t i = first; i < end; ++i)
    bytes += tokenizer.token_bytes(tokens[i].token);
  return bytes;
}

/// The first token of the shortest tail of `tokens[0, end)` holding at least `bytes` bytes (0
/// when all of them hold fewer), so that a long stream does not decode its whole text per token.
std::size_t tail_start(std::span<const generate::ScoredToken> tokens, std::size_t end,
                       std::size_t bytes, const tokenize::Tokenizer& tokenizer) {
  std::size_t held = 0;
  std::size_t first = end;
  while (first > 0 && held < bytes)
    held += tokenizer.token_bytes(tokens[--first].token).size();
  return first;
}

std::size_t longest(const std::vector<std::string>& stop) {
  std::size_t length = 0;
  for (const std::string& s : stop)
    length = std::max(length, s.size());
  return length;
}

/// A token as `logprobs.tokens` names it: its text when that is whole UTF-8 characters, else
/// "bytes:" and each byte as \xNN (OpenAI's form for a token of part of a character).
std::string token_label(std::int64_t token, const tokenize::Tokenizer& tokenizer) {
  const std::string bytes = tokenizer.token_bytes(token);
  if (valid_utf8(bytes) == bytes) return bytes;
  std::string label = "bytes:";
  for (const char byte : bytes)
    label += fmt::format("\\x{:02x}", static_cast<unsigned char>(byte));
  return label;
}

Json top_entry(const generate::ScoredToken& scored, const tokenize::Tokenizer& tokenizer) {
  Json top = Json::object();
  for (const auto& [token, logprob] : scored.top)
    top[token_label(token, tokenizer)] = logprob;
  return top;
}

/// Bytes of the generated text before token `index`.
std::size_t text_offset(std::span<const generate::ScoredToken> tokens, std::size_t index,
                        const tokenize::Tokenizer& tokenizer) {
  std::size_t offset = 0;
  for (std::size_t i = 0; i < index; ++i)
    offset += tokenizer.token_bytes(tokens[i].token).size();
  return offset;
}

/// The logprobs object of a chunk of a choice: the prompt's tokens first when `with_prompt`
/// (its first token unscored), then generated tokens [from, to).
Json logprobs_object(const CompletionParams& params, const ChoiceResult& choice, std::size_t from,
                     std::size_t to, bool with_prompt) {
  const tokenize::Tokenizer& tokenizer = *params.tokenizer;
  Json tokens = Json::array();
  Json logprobs = Json::array();
  Json tops = Json::array();
  Json offsets = Json::array();
  // Offsets count bytes of the choice's whole text (the echoed prompt first), also in a
  // stream's later chunks.
  std::size_t offset = text_offset(choice.tokens, from, tokenizer) +
                       (params.echo && !with_prompt ? tokenizer.decode(choice.prompt).size() : 0);
  const bool top = params.logprobs.value_or(0) > 0;
  const auto add = [&](std::int64_t token, const generate::ScoredToken* scored) {
    tokens.push_back(token_label(token, tokenizer));
    logprobs.push_back(scored ? Json(scored->logprob) : Json());
    if (top) tops.push_back(scored ? top_entry(*scored, tokenizer) : Json());
    offsets.push_back(offset);
    offset += tokenizer.token_bytes(token).size();
  };
  if (with_prompt) {
    for (std::size_t i = 0; i < choice.prompt.size(); ++i)
      add(choice.prompt[i],
          i == 0 || i - 1 >= choice.prompt_scores.size() ? nullptr : &choice.prompt_scores[i - 1]);
  }
  for (std::size_t i = from; i < to; ++i)
    add(choice.tokens[i].token, &choice.tokens[i]);
  Json out;
  out["tokens"] = std::move(tokens);
  out["token_logprobs"] = std::move(logprobs);
  out["top_logprobs"] = top ? std::move(tops) : Json();
  out["text_offset"] = std::move(offsets);
  return out;
}

/// The text of generated tokens [from, to), without what a stop sequence cut.
std::string choice_text(const CompletionParams& params, const ChoiceResult& choice,
                        std::size_t from, std::size_t to) {
  std::string text = token_text(choice.tokens, from, to, *params.tokenizer);
  if (choice.text_bytes) {
    const std::size_t before = text_offset(choice.tokens, from, *params.tokenizer);
    text.resize(std::min(text.size(), *choice.text_bytes - std::min(*choice.text_bytes, before)));
  }
  return text;
}

/// One entry of a chat choice's logprobs.content: the token, its log-probability and bytes.
Json chat_token_entry(std::int64_t token, double logprob, const tokenize::Tokenizer& tokenizer) {
  const std::string bytes = tokenizer.token_bytes(token);
  Json out;
  out["token"] = token_label(token, tokenizer);
  out["logprob"] = logprob;
  Json list = Json::array();
  for (const char byte : bytes)
    list.push_back(static_cast<unsigned char>(byte));
  out["bytes"] = std::move(list);
  return out;
}

/// A chat choice's logprobs object for generated tokens [from, to).
Json chat_logprobs(const CompletionParams& params, const ChoiceResult& choice, std::size_t from,
                   std::size_t to) {
  const tokenize::Tokenizer& tokenizer = *params.tokenizer;
  Json content = Json::array();
  for (std::size_t i = from; i < to; ++i) {
    const generate::ScoredToken& scored = choice.tokens[i];
    Json entry = chat_token_entry(scored.token, scored.logprob, tokenizer);
    Json top = Json::array();
    for (const auto& [token, logprob] : scored.top)
      top.push_back(chat_token_entry(token, logprob, tokenizer));
    entry["top_logprobs"] = std::move(top);
    content.push_back(std::move(entry));
  }
  Json out;
  out["content"] = std::move(content);
  return out;
}

/// A chat choice: the assistant's message (a stream's delta, its role in the first chunk).
Json chat_choice_object(const CompletionParams& params, std::size_t index,
                        const ChoiceResult& choice, std::size_t from, std::size_t to, bool first,
                        bool finished) {
  Json message = Json::object();
  if (first || !params.stream) message["role"] = "assistant";
  if (!params.stream || to > from || first)
    message["content"] = choice_text(params, choice, from, to);
  std::vector<std::int64_t> ids;
  for (std::size_t i = from; i < to; ++i)
    ids.push_back(choice.tokens[i].token);
  Json out;
  out["index"] = index;
  out[params.stream ? "delta" : "message"] = std::move(message);
  out["logprobs"] = params.logprobs ? chat_logprobs(params, choice, from, to) : Json();
  out["finish_reason"] = finished ? Json(choice.finish_reason) : Json();
  out["token_ids"] = ids;
  return out;
}

Json choice_object(const CompletionParams& params, std::size_t index, const ChoiceResult& choice,
                   std::size_t from, std::size_t to, bool with_prompt, bool finished) {
  if (params.chat)
    return chat_choice_object(params, index, choice, from, to, with_prompt, finished);
  std::string text;
  if (with_prompt) text = params.tokenizer->decode(choice.prompt);
  text += choice_text(params, choice, from, to);
  std::vector<std::int64_t> ids;
  for (std::size_t i = from; i < to; ++i)
    ids.push_back(choice.tokens[i].token);
  Json out;
  out["index"] = index;
  out["text"] = text;
  out["logprobs"] =
      params.logprobs ? logprobs_object(params, choice, from, to, with_prompt) : Json();
  out["finish_reason"] = finished ? Json(choice.finish_reason) : Json();
  out["token_ids"] = ids;
  return out;
}

Json response_start(const ResponseHeader& header, const char* object) {
  Json out;
  out["id"] = header.id;
  out["object"] = object;
  out["created"] = header.created;
  out["model"] = header.model;
  out["system_fingerprint"] = fmt::format("meshtensor-step-{}", header.weights_step);
  return out;
}

}  // namespace

const char* response_object(bool chat, bool chunk) {
  if (chat) return chunk ? "chat.completion.chunk" : "chat.completion";
  return "text_completion";
}

std::optional<StopCut> stop_cut(std::span<const generate::ScoredToken> tokens,
                                const std::vector<std::string>& stop,
                                const tokenize::Tokenizer& tokenizer) {
  if (tokens.empty() || stop.empty()) return std::nullopt;
  const std::size_t last = tokenizer.token_bytes(tokens.back().token).size();
  // A sequence ending in the last token's bytes starts at most longest - 1 bytes before them.
  const std::size_t first = tail_start(tokens, tokens.size(), last + longest(stop) - 1, tokenizer);
  const std::string tail = token_text(tokens, first, tokens.size(), tokenizer);
  std::size_t earliest = std::string::npos;
  for (const std::string& s : stop) {
    // The first occurrence that ends in the last token (earlier ones ended the choice before).
    for (std::size_t at = tail.find(s); at != std::string::npos; at = tail.find(s, at + 1)) {
      if (at + s.size() > tail.size() - last) {
        earliest = std::min(earliest, at);
        break;
      }
    }
  }
  if (earliest == std::string::npos) return std::nullopt;
  StopCut cut;
  cut.text_bytes = text_offset(tokens, first, tokenizer) + earliest;
  std::size_t offset = 0;
  while (cut.tokens < tokens.size() && offset < cut.text_bytes)
    offset += tokenizer.token_bytes(tokens[cut.tokens++].token).size();
  return cut;
}

namespace {

/// Bytes at the end of `bytes` a stream holds back: the longest that could still begin one of
/// `stop`, or an unfinished UTF-8 character.
std::size_t held_bytes(const std::string& bytes, const std::vector<std::string>& stop) {
  std::size_t hold = 0;
  for (const std::string& s : stop) {
    for (std::size_t length = std::min(s.size() - 1, bytes.size()); length > hold; --length) {
      if (bytes.compare(bytes.size() - length, length, s, 0, length) == 0) {
        hold = length;
        break;
      }
    }
  }
  for (std::size_t back = 1; back <= 3 && back <= bytes.size(); ++back) {
    const auto byte = static_cast<unsigned char>(bytes[bytes.size() - back]);
    if ((byte & 0xC0) == 0x80) continue;  // a continuation byte
    const std::size_t length = byte >= 0xF0 ? 4 : byte >= 0xE0 ? 3 : byte >= 0xC0 ? 2 : 1;
    if (length > back) hold = std::max(hold, back);
    break;
  }
  return hold;
}

}  // namespace

std::size_t streamable_tokens(std::span<const generate::ScoredToken> tokens,
                              const std::vector<std::string>& stop,
                              const tokenize::Tokenizer& tokenizer) {
  std::size_t end = tokens.size();
  while (end > 0) {
    const std::size_t first = tail_start(tokens, end, longest(stop) + 3, tokenizer);
    if (held_bytes(token_text(tokens, first, end, tokenizer), stop) == 0) break;
    --end;  // the token holding the held bytes waits, whole
  }
  return end;
}

Json usage(const CompletionParams& params, const std::vector<ChoiceResult>& choices) {
  std::int64_t prompt = 0;
  for (const auto& p : params.prompts)
    prompt += static_cast<std::int64_t>(p.size());
  std::int64_t completion = 0;
  for (const ChoiceResult& c : choices)
    completion += static_cast<std::int64_t>(c.tokens.size());
  Json out;
  out["prompt_tokens"] = prompt;
  out["completion_tokens"] = completion;
  out["total_tokens"] = prompt + completion;
  return out;
}

Json completion_response(const ResponseHeader& header, const CompletionParams& params,
                         const std::vector<ChoiceResult>& choices) {
  Json out = response_start(header, response_object(params.chat, false));
  Json list = Json::array();
  for (std::size_t i = 0; i < choices.size(); ++i)
    list.push_back(
        choice_object(params, i, choices[i], 0, choices[i].tokens.size(), params.echo, true));
  out["choices"] = std::move(list);
  out["usage"] = usage(params, choices);
  out["weights_step"] = header.weights_step;
  out["seed"] = header.seed;
  return out;
}

Json completion_chunk(const ResponseHeader& header, const CompletionParams& params,
                      std::size_t index, const ChoiceResult& choice, std::size_t from,
                      std::size_t to, bool with_prompt, bool finished) {
  Json out = response_start(header, response_object(params.chat, true));
  Json list = Json::array();
  list.push_back(choice_object(params, index, choice, from, to, with_prompt, finished));
  out["choices"] = std::move(list);
  out["weights_step"] = header.weights_step;
  return out;
}

ChunkWriter::ChunkWriter(const ResponseHeader& header, bool chat) {
  Json start = response_start(header, response_object(chat, true));
  start["choices"] = Json::array();
  start["weights_step"] = header.weights_step;
  const std::string whole = dump(start);
  const std::size_t at = whole.find("\"choices\":[]");
  prefix_ = whole.substr(0, at) + "\"choices\":[";
  suffix_ = whole.substr(at + std::string("\"choices\":[").size());
}

std::string ChunkWriter::chunk(const CompletionParams& params, std::size_t index,
                               const ChoiceResult& choice, std::size_t from, std::size_t to,
                               bool with_prompt, bool finished) const {
  return prefix_ + dump(choice_object(params, index, choice, from, to, with_prompt, finished)) +
         suffix_;
}

std::string dump(const Json& value) {
  return value.dump(-1, ' ', false, Json::error_handler_t::replace);
}

}  // namespace meshtensor::serve
