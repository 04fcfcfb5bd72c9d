#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace meshtensor::tokenize {

/// A token matched in the text before pre-tokenization (Hugging Face's added tokens), such as the
/// special `<|endoftext|>`: its content encodes to its id wherever it is matched.
struct AddedToken {
  std::string content;
  std::int64_t id = 0;
  bool special = true;
  /// Matched only where no word character (Unicode \w) touches it on either side.
  bool single_word = false;
  /// The whitespace before (lstrip) or after (rstrip) a match belongs to the token.
  bool lstrip = false;
  bool rstrip = false;
  /// Matched in the normalized text, after the tokens that are not (Hugging Face's order).
  bool normalized = false;
};

/// A span of a text: an added token's match (`token` its index in the set) or text between
/// matches (`token` = -1).
struct TextSpan {
  std::size_t begin = 0;
  std::size_t end = 0;
  std::int64_t token = -1;
};

/// Finds a set of added tokens in a text in one pass (an Aho-Corasick automaton over bytes):
/// non-overlapping matches from left to right, at each step the leftmost match and of those
/// starting there the longest, as Hugging Face's `LeftmostLongest` matching does. Time is linear
/// in the text plus, per match, the length of the longest token.
class AddedTokenMatcher {
 public:
  AddedTokenMatcher() = default;
  /// The automaton of `tokens` (non-empty contents).
  explicit AddedTokenMatcher(const std::vector<AddedToken>& tokens);
  /// True when the set is empty.
  bool empty() const { return tokens_.empty(); }
  /// The token a span's index names.
  const AddedToken& token(std::int64_t index) const {
    return tokens_[static_cast<std::size_t>(index)];
  }
  /// The spans of `text`, in order, covering it whole: matches with single_word, lstrip and rstrip
  /// applied as Hugging Face applies them (a match that is not a single word is text, and the
  /// whitespace a strip takes joins the token).
  std::vector<TextSpan> split(std::string_view text) const;

 private:
  struct Match {
    std::size_t begin = 0;
    std::size_t end = 0;
    std::int32_t token = -1;
  };
  /// The leftmost-longest match starting at or after `from`, or token -1.
  Match next_match(std::string_view text, std::size_t from) const;
  std::int32_t step(std::int32_t state, unsigned char byte) const;

  struct Edge {
    unsigned char byte;
    std::int32_t to;
  };
  std::vector<AddedToken> tokens_;
  std::vector<std::vector<Edge>> edges_;  // per state, sorted by byte
  std::vector<std::int32_t> root_;        // 256 transitions of the root state
  std::vector<std::int32_t> fail_;
  std::vector<std::int32_t> depth_;
  std::vector<std::int32_t> output_;  // per state: the longest token that ends it, or -1
};

/// Unicode White_Space (as Rust's `char::is_whitespace` and Oniguruma's \s).
bool is_unicode_space(char32_t c);
/// Unicode's numeric characters (general categories Nd, Nl, No), as Rust's char::is_numeric.
bool is_unicode_numeric(char32_t c);
/// Unicode \w as the regex crate defines it: Alphabetic, marks, decimal digits, connector
/// punctuation and join controls.
bool is_unicode_word(char32_t c);

}  // namespace meshtensor::tokenize
