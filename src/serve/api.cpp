#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

#include <fmt/format.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/core/untrusted_json.hpp>
#include <meshtensor/core/utf8.hpp>
#include <meshtensor/serve/api.hpp>

namespace meshtensor::serve {

namespace {

using nlohmann::json;

ApiError bad(const std::string& param, const std::string& message) {
  return {400, message, "invalid_request_error", param, ""};
}

std::string excerpt(const json& value) {
  return json_excerpt(value);
}

/// The field `key`, or null when absent or null (optional fields take null as absent).
const json* field(const json& doc, const char* key) {
  const auto found = doc.find(key);
  if (found == doc.end() || found->is_null()) return nullptr;
  return &*found;
}

std::int64_t integer_value(const json& value, const std::string& key, std::int64_t low,
                           std::int64_t high) {
  std::int64_t result = 0;
  if (value.is_number_integer() && !value.is_number_unsigned()) {
    result = value.get<std::int64_t>();
  } else if (value.is_number_unsigned() &&
             value.get<std::uint64_t>() <= static_cast<std::uint64_t>(high)) {
    result = static_cast<std::int64_t>(value.get<std::uint64_t>());
  } else if (value.is_number_unsigned()) {
    throw bad(key, fmt::format("'{}': {} is more than {}", key, excerpt(value), high));
  } else if (value.is_number_float() && std::isfinite(value.get<double>()) &&
             value.get<double>() == std::trunc(value.get<double>()) &&
             std::abs(value.get<double>()) < 0x1p62) {
    result = static_cast<std::int64_t>(value.get<double>());
  } else {
    throw bad(key, fmt::format("'{}' must be an integer, got {}", key, excerpt(value)));
  }
  if (result < low) throw bad(key, fmt::format("'{}': {} is less than {}", key, result, low));
  if (result > high) throw bad(key, fmt::format("'{}': {} is more than {}", key, result, high));
  return result;
}

double number_value(const json& value, const std::string& key, double low, double high) {
  if (!value.is_number()) {
    throw bad(key, fmt::format("'{}' must be a number, got {}", key, excerpt(value)));
  }
  const double result = value.get<double>();
  if (!(result >= low && result <= high)) {
    throw bad(key,
              fmt::format("'{}': {} is not between {} and {}", key, excerpt(value), low, high));
  }
  return result;
}

bool bool_value(const json& value, const std::string& key) {
  if (!value.is_boolean())
    throw bad(key, fmt::format("'{}' must be true or false, got {}", key, excerpt(value)));
  return value.get<bool>();
}

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

/// Why `body` is not valid JSON, naming the top-level field the parser stopped in (a number
/// past the range of a double, such as 1e999, is one).
ApiError invalid_json(std::string_view body) {
  std::string key;
  const json::parser_callback_t last_key = [&](int depth, json::parse_event_t event, json& value) {
    if (depth == 1 && event == json::parse_event_t::key) key = value.get<std::string>();
    return true;
  };
  try {
    const json reparsed = json::parse(body, last_key);
    (void)reparsed;
  } catch (const json::out_of_range& e) {
    return bad(key, fmt::format("'{}' is not a number the server can read: {}", key, e.what()));
  } catch (const json::exception& e) {
    return bad("", fmt::format("the request body is not valid JSON: {}", e.what()));
  }
  return bad("", "the request body is not valid JSON");
}

json parse_body(std::string_view body) {
  json doc;
  try {
    doc = parse_untrusted_json(body, "the request body");
  } catch (const Error& e) {
    throw bad("", e.what());
  }
  if (doc.is_discarded()) throw invalid_json(body);
  if (!doc.is_object()) {
    throw bad("", fmt::format("the request body must be a JSON object, got {}", excerpt(doc)));
  }
  for (const auto& [key, value] : doc.items()) {
    if (known_fields().count(key) == 0) {
      throw bad(key, fmt::format("Unrecognized request argument supplied: '{}' (a misspelt field "
                                 "is refused rather than ignored)",
                                 key));
    }
  }
  return doc;
}

std::vector<std::int64_t> token_prompt(const json& tokens, std::size_t index,
                                       const nn::DecoderConfig& config) {
  if (tokens.size() > static_cast<std::size_t>(nn::decoder_context(config))) {
    throw bad("prompt", fmt::format("prompt {} is {} tokens, but the model's context is {}", index,
                                    tokens.size(), nn::decoder_context(config)));
  }
  std::vector<std::int64_t> prompt;
  for (const json& token : tokens) {
    const std::string key = fmt::format("prompt[{}]", index);
    prompt.push_back(integer_value(token, key, 0, nn::decoder_vocabulary(config) - 1));
  }
  return prompt;
}

/// string | [string, ...] | [token, ...] | [[token, ...], ...]
std::vector<std::vector<std::int64_t>> parse_prompts(const json& doc,
                                                     const nn::DecoderConfig& config,
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
    if (static_cast<std::int64_t>(prompts[i].size()) >= nn::decoder_context(config)) {
      throw bad("prompt", fmt::format("prompt {} is {} tokens, but the model's context is {} "
                                      "(it must leave room for a new token)",
                                      i, prompts[i].size(), nn::decoder_context(config)));
    }
  }
  return prompts;
}

std::int64_t parse_max_tokens(const json& doc, const CompletionParams& params,
                              const nn::DecoderConfig& config) {
  std::int64_t longest = 0;
  for (const auto& prompt : params.prompts)
    longest = std::max<std::int64_t>(longest, static_cast<std::int64_t>(prompt.size()));
  const std::int64_t room = nn::decoder_context(config) - longest;
  const json* value = field(doc, "max_tokens");
  if (value == nullptr) return std::min<std::int64_t>(16, room);
  const std::int64_t max_tokens =
      integer_value(*value, "max_tokens", 1, std::numeric_limits<std::int64_t>::max());
  if (max_tokens > room) {
    throw bad("max_tokens",
              fmt::format("'max_tokens': {} new tokens after a prompt of {} tokens is more than "
                          "the model's context of {} (at most {} here)",
                          max_tokens, longest, nn::decoder_context(config), room));
  }
  return max_tokens;
}

std::vector<std::string> parse_stop(const json& doc, const ApiLimits& limits) {
  const json* value = field(doc, "stop");
  if (value == nullptr) return {};
  std::vector<std::string> stop;
  if (value->is_string()) {
    stop.push_back(value->get<std::string>());
  } else if (value->is_array()) {
    for (const json& item : *value) {
      if (!item.is_string())
        throw bad("stop", fmt::format("'stop' items must be strings, got {}", excerpt(item)));
      stop.push_back(item.get<std::string>());
    }
  } else {
    throw bad("stop",
              fmt::format("'stop' must be a string or a list of strings, got {}", excerpt(*value)));
  }
  if (static_cast<std::int64_t>(stop.size()) > limits.max_stop) {
    throw bad("stop", fmt::format("'stop' has {} sequences; at most {} are allowed", stop.size(),
                                  limits.max_stop));
  }
  for (const std::string& s : stop) {
    if (s.empty()) throw bad("stop", "'stop' sequences must not be empty");
    if (static_cast<std::int64_t>(s.size()) > limits.max_stop_bytes) {
      throw bad("stop", fmt::format("a 'stop' sequence of {} bytes is longer than the {} allowed",
                                    s.size(), limits.max_stop_bytes));
    }
  }
  return stop;
}

/// OpenAI fields the server takes only at their neutral values.
void check_unsupported(const json& doc, std::int64_t n) {
  for (const char* key : {"presence_penalty", "frequency_penalty"}) {
    if (const json* value = field(doc, key); value && number_value(*value, key, -2, 2) != 0)
      throw bad(key, fmt::format("'{}' is not supported: only 0, got {}", key, excerpt(*value)));
  }
  if (const json* value = field(doc, "best_of");
      value && integer_value(*value, "best_of", 1, 1 << 20) != n) {
    throw bad("best_of", fmt::format("'best_of' {} is not supported: give n choices instead",
                                     excerpt(*value)));
  }
  if (const json* value = field(doc, "logit_bias");
      value && !(value->is_object() && value->empty())) {
    throw bad("logit_bias", "'logit_bias' is not supported");
  }
  if (const json* value = field(doc, "suffix"); value && *value != "")
    throw bad("suffix", "'suffix' is not supported");
  if (const json* value = field(doc, "user"); value && !value->is_string())
    throw bad("user", fmt::format("'user' must be a string, got {}", excerpt(*value)));
}

void parse_sampling(const json& doc, CompletionParams& params, std::uint64_t default_seed) {
  params.sampling.temperature = 1.0;
  if (const json* v = field(doc, "temperature"))
    params.sampling.temperature = number_value(*v, "temperature", 0, 2);
  if (const json* v = field(doc, "top_p")) params.sampling.top_p = number_value(*v, "top_p", 0, 1);
  if (const json* v = field(doc, "top_k")) {
    params.sampling.top_k = std::max<std::int64_t>(0, integer_value(*v, "top_k", -1, 1 << 30));
  }
  params.sampling.seed = default_seed;
  if (const json* v = field(doc, "seed")) {
    params.seed_given = true;
    if (v->is_number_unsigned()) {
      params.sampling.seed = v->get<std::uint64_t>();
    } else {
      params.sampling.seed = static_cast<std::uint64_t>(
          integer_value(*v, "seed", std::numeric_limits<std::int64_t>::min(),
                        std::numeric_limits<std::int64_t>::max()));
    }
  }
}

void parse_output_options(const json& doc, CompletionParams& params, const ApiLimits& limits) {
  if (const json* v = field(doc, "logprobs"))
    params.logprobs = integer_value(*v, "logprobs", 0, limits.max_top_logprobs);
  if (const json* v = field(doc, "echo")) params.echo = bool_value(*v, "echo");
  if (const json* v = field(doc, "stream")) params.stream = bool_value(*v, "stream");
  if (const json* v = field(doc, "stream_options")) {
    if (!v->is_object()) {
      throw bad("stream_options",
                fmt::format("'stream_options' must be an object, got {}", excerpt(*v)));
    }
    for (const auto& [key, value] : v->items()) {
      if (key != "include_usage")
        throw bad("stream_options", fmt::format("unknown 'stream_options' field '{}'", key));
      params.include_usage = bool_value(value, "stream_options.include_usage");
    }
  }
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
                                          const nn::DecoderConfig& config,
                                          std::shared_ptr<const tokenize::Tokenizer> tokenizer,
                                          const ApiLimits& limits, std::uint64_t default_seed) {
  const json doc = parse_body(body);
  if (const json* model = field(doc, "model")) {
    if (!model->is_string())
      throw bad("model", fmt::format("'model' must be a string, got {}", excerpt(*model)));
    if (model->get<std::string>() != model_name) {
      throw ApiError{404,
                     fmt::format("The model '{}' does not exist: this server serves '{}'",
                                 model->get<std::string>(), model_name),
                     "invalid_request_error", "model", "model_not_found"};
    }
  }
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
  check_unsupported(doc, params.n);
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

Json choice_object(const CompletionParams& params, std::size_t index, const ChoiceResult& choice,
                   std::size_t from, std::size_t to, bool with_prompt, bool finished) {
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

Json response_start(const ResponseHeader& header) {
  Json out;
  out["id"] = header.id;
  out["object"] = "text_completion";
  out["created"] = header.created;
  out["model"] = header.model;
  out["system_fingerprint"] = fmt::format("meshtensor-step-{}", header.weights_step);
  return out;
}

}  // namespace

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
  Json out = response_start(header);
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
  Json out = response_start(header);
  Json list = Json::array();
  list.push_back(choice_object(params, index, choice, from, to, with_prompt, finished));
  out["choices"] = std::move(list);
  out["weights_step"] = header.weights_step;
  return out;
}

ChunkWriter::ChunkWriter(const ResponseHeader& header) {
  Json start = response_start(header);
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
