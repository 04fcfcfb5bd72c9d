#include <limits>
#include <set>

#include <fmt/format.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/core/untrusted_json.hpp>
#include <meshtensor/serve/api.hpp>

#include "request_fields.hpp"

namespace meshtensor::serve {

namespace {

const std::set<std::string>& chat_fields() {
  static const std::set<std::string> fields{"model",
                                            "messages",
                                            "max_tokens",
                                            "max_completion_tokens",
                                            "temperature",
                                            "top_p",
                                            "top_k",
                                            "seed",
                                            "n",
                                            "stop",
                                            "logprobs",
                                            "top_logprobs",
                                            "stream",
                                            "stream_options",
                                            "user",
                                            "logit_bias",
                                            "tools",
                                            "tool_choice",
                                            "response_format",
                                            "presence_penalty",
                                            "frequency_penalty",
                                            "add_generation_prompt",
                                            "chat_template_kwargs"};
  return fields;
}

/// Chat fields taken only at what the server does: no tools, text responses.
void check_chat_only_fields(const json& doc) {
  check_neutral_fields(doc);
  if (const json* v = field(doc, "tools"); v && !(v->is_array() && v->empty())) {
    throw bad("tools",
              "'tools' is not supported: the server does not parse tool calls out of the text");
  }
  if (const json* v = field(doc, "tool_choice"); v && *v != "none")
    throw bad("tool_choice",
              fmt::format("'tool_choice' {} is not supported: only \"none\"", excerpt(*v)));
  if (const json* v = field(doc, "response_format");
      v && !(v->is_object() && v->size() == 1 && v->value("type", "") == "text")) {
    throw bad("response_format", fmt::format("'response_format' {} is not supported: only "
                                             "{{\"type\": \"text\"}}",
                                             excerpt(*v)));
  }
}

/// The rendering options: add_generation_prompt and chat_template_kwargs (kept in the order
/// the request gives its keys, as Python's dicts are, for templates that print them).
tokenize::ChatOptions chat_options(const json& doc, const Json& ordered) {
  tokenize::ChatOptions options;
  if (const json* v = field(doc, "add_generation_prompt"))
    options.add_generation_prompt = bool_value(*v, "add_generation_prompt");
  if (field(doc, "chat_template_kwargs") != nullptr) {
    const Json& kwargs = ordered.at("chat_template_kwargs");
    if (!kwargs.is_object()) {
      throw bad("chat_template_kwargs", fmt::format("'chat_template_kwargs' must be an object, "
                                                    "got {}",
                                                    excerpt(kwargs)));
    }
    for (const auto& [key, value] : kwargs.items()) {
      if (key == "messages" || key == "add_generation_prompt") {
        throw bad("chat_template_kwargs",
                  fmt::format("'chat_template_kwargs' may not set '{}': give it as the "
                              "request's own field",
                              key));
      }
      options.variables[key] = value;
    }
  }
  return options;
}

/// The rendered conversation's ids, within the context.
std::vector<std::int64_t> chat_prompt(const json& doc, std::string_view body,
                                      const ChatSupport& chat, const nn::DecoderSpec& config) {
  if (!chat.format) {
    throw ApiError{400, "This model does not chat: " + chat.missing, "invalid_request_error",
                   "messages", "chat_template_missing"};
  }
  if (field(doc, "messages") == nullptr) throw bad("messages", "'messages' is required");
  const Json ordered = Json::parse(body);
  std::vector<std::int64_t> prompt;
  try {
    prompt = chat.format->encode(ordered.at("messages"), chat_options(doc, ordered));
  } catch (const Error& e) {
    throw bad("messages", e.what());
  }
  if (prompt.empty()) throw bad("messages", "the rendered conversation has no tokens");
  if (static_cast<std::int64_t>(prompt.size()) >= config.context) {
    throw bad("messages",
              fmt::format("the rendered conversation is {} tokens, but the model's context is {} "
                          "(it must leave room for a new token)",
                          prompt.size(), config.context));
  }
  return prompt;
}

/// max_completion_tokens (OpenAI's newer name) or max_tokens; by default the rest of the
/// context, as vLLM does.
std::int64_t chat_max_tokens(const json& doc, std::int64_t prompt, const nn::DecoderSpec& config) {
  const std::int64_t room = config.context - prompt;
  const char* key = field(doc, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  const json* value = field(doc, key);
  if (value == nullptr) return room;
  const std::int64_t max_tokens =
      integer_value(*value, key, 1, std::numeric_limits<std::int64_t>::max());
  if (max_tokens > room) {
    throw bad(key, fmt::format("'{}': {} new tokens after a conversation of {} tokens is more "
                               "than the model's context of {} (at most {} here)",
                               key, max_tokens, prompt, config.context, room));
  }
  return max_tokens;
}

void chat_logprobs(const json& doc, CompletionParams& params, const ApiLimits& limits) {
  const json* wanted = field(doc, "logprobs");
  const json* top = field(doc, "top_logprobs");
  if (wanted && bool_value(*wanted, "logprobs")) params.logprobs = 0;
  if (top != nullptr) {
    const std::int64_t k = integer_value(*top, "top_logprobs", 0, limits.max_top_logprobs);
    if (!params.logprobs) throw bad("top_logprobs", "'top_logprobs' needs 'logprobs': true");
    params.logprobs = k;
  }
}

}  // namespace

ChatSupport chat_support(std::shared_ptr<const tokenize::Tokenizer> tokenizer) {
  ChatSupport support;
  try {
    support.format = std::make_shared<const tokenize::ChatFormat>(std::move(tokenizer));
  } catch (const ParseError& e) {
    support.missing = e.what();
  }
  return support;
}

CompletionParams parse_chat_request(std::string_view body, const std::string& model_name,
                                    const nn::DecoderSpec& config, const ChatSupport& chat,
                                    const ApiLimits& limits, std::uint64_t default_seed) {
  const json doc = parse_body(body, chat_fields());
  check_model(doc, model_name);
  CompletionParams params;
  params.chat = true;
  params.prompts.push_back(chat_prompt(doc, body, chat, config));
  params.tokenizer =
      std::shared_ptr<const tokenize::Tokenizer>(chat.format, &chat.format->tokenizer());
  if (const json* v = field(doc, "n")) params.n = integer_value(*v, "n", 1, limits.max_choices);
  params.max_tokens =
      chat_max_tokens(doc, static_cast<std::int64_t>(params.prompts[0].size()), config);
  params.stop = parse_stop(doc, limits);
  check_chat_only_fields(doc);
  parse_sampling(doc, params, default_seed);
  chat_logprobs(doc, params, limits);
  parse_stream(doc, params);
  try {
    generate::check_request({params.prompts[0], params.max_tokens, params.sampling}, 0, config);
  } catch (const Error& e) {
    throw bad("", e.what());
  }
  return params;
}

}  // namespace meshtensor::serve
