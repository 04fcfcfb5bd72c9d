#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace meshtensor::tokenize {

/// The normalizer of a `tokenizer.json`, as Hugging Face applies it: to each span of text
/// between the added tokens matched as given, before the normalized added tokens are matched and
/// before pre-tokenization. Its parts: the Unicode normalization forms (NFC, NFD, NFKC, NFKD,
/// by ICU), Prepend (a string before a non-empty span), Replace of a String pattern, and a
/// Sequence of them.
class Normalizer {
 public:
  /// No normalizer: text passes unchanged.
  Normalizer() = default;
  /// The normalizer `spec` describes (null: none). DataError naming a part or a field
  /// meshtensor does not compute (a Replace by a Regex, Lowercase, BertNormalizer, ...).
  static Normalizer from_json(const nlohmann::json& spec, const std::string& source);
  /// True when text passes unchanged.
  bool empty() const { return steps_.empty(); }
  /// `text` (valid UTF-8) normalized.
  std::string apply(std::string_view text) const;
  /// The spec from_json() reads back (null when empty()).
  nlohmann::json to_json() const;

 private:
  enum class Kind { form, prepend, replace };
  struct Step {
    Kind kind;
    std::string text;         ///< the form's name (NFC, ...), Prepend's string, Replace's pattern
    std::string replacement;  ///< Replace's content
  };
  void add(const nlohmann::json& spec, const std::string& type);
  std::vector<Step> steps_;
};

}  // namespace meshtensor::tokenize
