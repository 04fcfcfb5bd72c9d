#pragma once

#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace meshtensor::tokenize {

/// A model folder's chat template (tokenizer_config.json's "chat_template"): the subset of Jinja
/// published templates use, rendered as transformers renders it (trim_blocks and lstrip_blocks,
/// loop controls): text with `{{ }}`, `{% %}`, `{# #}` and their `-` whitespace control; `if` /
/// `elif` / `else`, `for` (with `loop`, tuple targets, `else`, `break`, `continue`), `set` (of a
/// name or a namespace attribute); literals, names, attributes, items, slices, calls of string
/// and dict methods and of `namespace`, `range`, `raise_exception`; filters and tests by name.
/// Values are JSON values, objects keeping their keys' order (and an undefined one).
class ChatTemplate {
 public:
  /// Parses `source`. ParseError naming the line and the construct it does not parse or render
  /// (a macro, an unknown filter or test, an unclosed block).
  explicit ChatTemplate(std::string_view source);
  ~ChatTemplate();
  ChatTemplate(ChatTemplate&&) noexcept;
  ChatTemplate& operator=(ChatTemplate&&) noexcept;
  /// The text of the template with `context`'s keys as its variables (messages,
  /// add_generation_prompt, bos_token, ...). DataError for raise_exception (its message) and
  /// for an operation on values that do not take it, naming the line.
  std::string render(const nlohmann::ordered_json& context) const;

  struct Node;

 private:
  std::shared_ptr<const Node> root_;
};

}  // namespace meshtensor::tokenize
