#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace meshtensor::tokenize {

/// GPT-2's pre-tokenizer pattern (Hugging Face's ByteLevel with use_regex): contractions, runs of
/// letters, of digits and of other symbols (each with one leading space), and whitespace.
inline constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

/// Llama 3's (and tiktoken's cl100k_base) pre-tokenizer pattern: case-insensitive contractions,
/// letters with one leading non-letter, digits in groups of at most three, symbols with their
/// trailing newlines, and whitespace.
inline constexpr std::string_view kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

/// tiktoken's o200k_base pattern (GPT-4o): words split at case changes with their contractions,
/// digits in groups of at most three, symbols with trailing newlines or slashes, and whitespace.
inline constexpr std::string_view kO200kPattern =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

/// A pre-tokenizer's split of UTF-8 text by a regular expression with Unicode classes (PCRE2,
/// JIT-compiled, Unicode properties for \p, \s, \w and \d), Hugging Face's Split with the
/// "Isolated" behaviour: every match is a piece, and so is every run of text between matches.
class SplitPattern {
 public:
  /// ParseError naming the pattern and the position PCRE2 reports when it does not compile.
  explicit SplitPattern(std::string pattern);
  ~SplitPattern();
  SplitPattern(SplitPattern&&) noexcept;
  SplitPattern& operator=(SplitPattern&&) noexcept;
  /// The pieces of `text` (valid UTF-8), in order; together they are the whole text.
  std::vector<std::string_view> pieces(std::string_view text) const;
  /// Calls `take` with each piece of `text` in order, holding none of them.
  void for_each_piece(std::string_view text,
                      const std::function<void(std::string_view)>& take) const;
  /// Calls `take` with each part of `text` in order: every non-empty match (true) and every run
  /// of text between matches (false).
  void for_each_part(std::string_view text,
                     const std::function<void(std::string_view, bool)>& take) const;
  /// The pattern.
  const std::string& pattern() const { return pattern_; }

 private:
  struct Compiled;
  std::string pattern_;
  std::unique_ptr<Compiled> compiled_;
};

}  // namespace meshtensor::tokenize
