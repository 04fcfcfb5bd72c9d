#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <meshtensor/tokenize/chat_template.hpp>
#include <meshtensor/tokenize/tokenizer.hpp>

namespace meshtensor::tokenize {

/// How a conversation is rendered: besides the messages, whether the template's opening of the
/// assistant's turn follows them, and the variables a request adds (vLLM's
/// chat_template_kwargs; `enable_thinking` for Qwen3, say).
struct ChatOptions {
  bool add_generation_prompt = true;
  nlohmann::ordered_json variables = nlohmann::ordered_json::object();
};

/// A model's conversations as tokens: its tokenizer's chat template (or one given instead)
/// rendered with OpenAI-style messages and the tokenizer's bos/eos/pad tokens, then encoded
/// as transformers' apply_chat_template(tokenize=True) does: the special tokens the text holds
/// are read as such, and the post-processor adds none (the template writes them).
class ChatFormat {
 public:
  /// The format of `tokenizer`'s own template. ParseError when it has none (naming how to give
  /// one) and when the template uses a construct the renderer refuses (naming it).
  explicit ChatFormat(std::shared_ptr<const Tokenizer> tokenizer);
  /// The format of the template `source` (`origin` names it in errors: a file, say).
  ChatFormat(std::shared_ptr<const Tokenizer> tokenizer, const std::string& source,
             const std::string& origin);

  /// `messages` checked and put in the form templates read: a non-empty list of objects with a
  /// "role" (system, developer, user, assistant or tool) and a "content" that is a string, null,
  /// or a list of {"type": "text", "text"} parts (joined with newlines, as vLLM does); other
  /// keys (name, tool_calls, tool_call_id) pass through. DataError naming the message and field.
  static nlohmann::ordered_json checked_messages(const nlohmann::ordered_json& messages);
  /// The rendered text of the conversation (messages checked first). DataError for a message
  /// that is not well formed and for a template that raises an exception (its message).
  std::string render(const nlohmann::ordered_json& messages, const ChatOptions& options) const;
  /// The ids of render()'s text.
  std::vector<std::int64_t> encode(const nlohmann::ordered_json& messages,
                                   const ChatOptions& options) const;
  const Tokenizer& tokenizer() const { return *tokenizer_; }

 private:
  std::shared_ptr<const Tokenizer> tokenizer_;
  std::shared_ptr<const ChatTemplate> template_;
};

}  // namespace meshtensor::tokenize
