#include <algorithm>
#include <array>
#include <string_view>

#include <fmt/format.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/core/untrusted_json.hpp>
#include <meshtensor/tokenize/chat_format.hpp>

namespace meshtensor::tokenize {

namespace {

using Json = nlohmann::ordered_json;

constexpr std::array<std::string_view, 5> kRoles = {"system", "developer", "user", "assistant",
                                                    "tool"};

/// A content of text parts as one string.
Json joined_parts(const Json& parts, std::size_t index) {
  std::string text;
  for (std::size_t p = 0; p < parts.size(); ++p) {
    const Json& part = parts[p];
    const auto type = part.is_object() ? part.find("type") : part.end();
    if (type == part.end() || *type != "text") {
      throw DataError(fmt::format(
          "messages[{}].content[{}]: only text parts ({{\"type\": \"text\", \"text\": ...}}) are "
          "read, got {}",
          index, p, json_excerpt(part)));
    }
    const auto value = part.find("text");
    if (value == part.end() || !value->is_string())
      throw DataError(fmt::format("messages[{}].content[{}].text must be a string", index, p));
    if (p > 0) text += '\n';
    text += value->get<std::string>();
  }
  return text;
}

Json checked_message(const Json& message, std::size_t index) {
  if (!message.is_object()) {
    throw DataError(fmt::format("messages[{}] must be an object with a role and a content, got {}",
                                index, json_excerpt(message)));
  }
  const auto role = message.find("role");
  if (role == message.end() || !role->is_string() ||
      std::find(kRoles.begin(), kRoles.end(), role->get<std::string>()) == kRoles.end()) {
    throw DataError(fmt::format(
        "messages[{}].role must be one of system, developer, user, assistant and tool, got {}",
        index, role == message.end() ? std::string("nothing") : json_excerpt(*role)));
  }
  Json out = message;
  const auto content = message.find("content");
  if (content == message.end()) {
    throw DataError(fmt::format("messages[{}] has no content", index));
  } else if (content->is_array()) {
    out["content"] = joined_parts(*content, index);
  } else if (!content->is_string() && !content->is_null()) {
    throw DataError(
        fmt::format("messages[{}].content must be a string, null or a list of text parts, got {}",
                    index, json_excerpt(*content)));
  }
  return out;
}

}  // namespace

ChatFormat::ChatFormat(std::shared_ptr<const Tokenizer> tokenizer)
    : tokenizer_(std::move(tokenizer)) {
  if (tokenizer_->chat_template().empty()) {
    throw ParseError(
        "the model has no chat template (tokenizer_config.json's \"chat_template\" or "
        "chat_template.jinja): give one with --chat-template FILE");
  }
  try {
    template_ = std::make_shared<const ChatTemplate>(tokenizer_->chat_template());
  } catch (const ParseError& e) {
    throw ParseError(fmt::format("the model's chat template: {}", e.what()));
  }
}

ChatFormat::ChatFormat(std::shared_ptr<const Tokenizer> tokenizer, const std::string& source,
                       const std::string& origin)
    : tokenizer_(std::move(tokenizer)) {
  try {
    template_ = std::make_shared<const ChatTemplate>(source);
  } catch (const ParseError& e) {
    throw ParseError(fmt::format("{}: {}", origin, e.what()));
  }
}

Json ChatFormat::checked_messages(const Json& messages) {
  if (!messages.is_array() || messages.empty()) {
    throw DataError(fmt::format("messages must be a non-empty list of messages, got {}",
                                json_excerpt(messages)));
  }
  Json out = Json::array();
  for (std::size_t i = 0; i < messages.size(); ++i)
    out.push_back(checked_message(messages[i], i));
  return out;
}

std::string ChatFormat::render(const Json& messages, const ChatOptions& options) const {
  Json context = Json::object();
  const SpecialRoles& roles = tokenizer_->roles();
  // transformers passes the special tokens map: a token the tokenizer lacks is undefined.
  for (const auto& [key, token] :
       {std::pair{"bos_token", &roles.bos_token}, std::pair{"eos_token", &roles.eos_token},
        std::pair{"pad_token", &roles.pad_token}}) {
    if (!token->empty()) context[key] = *token;
  }
  if (options.variables.is_object()) {
    for (const auto& [key, value] : options.variables.items())
      context[key] = value;
  }
  context["messages"] = checked_messages(messages);
  context["add_generation_prompt"] = options.add_generation_prompt;
  return template_->render(context);
}

std::vector<std::int64_t> ChatFormat::encode(const Json& messages,
                                             const ChatOptions& options) const {
  return tokenizer_->encode(render(messages, options));
}

}  // namespace meshtensor::tokenize
