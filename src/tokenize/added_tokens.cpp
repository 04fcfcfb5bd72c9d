#define PCRE2_CODE_UNIT_WIDTH 8
#include <algorithm>
#include <deque>
#include <memory>
#include <pcre2.h>

#include <meshtensor/core/utf8.hpp>
#include <meshtensor/tokenize/added_tokens.hpp>

namespace meshtensor::tokenize {

namespace {

constexpr std::int32_t kRoot = 0;

/// Where the character that ends at `end` of valid UTF-8 `text` starts (end > 0).
std::size_t previous_start(std::string_view text, std::size_t end) {
  std::size_t begin = end - 1;
  while (begin > 0 && (static_cast<unsigned char>(text[begin]) & 0xC0) == 0x80)
    --begin;
  return begin;
}

char32_t code_point_at(std::string_view text, std::size_t at) {
  char32_t c = 0;
  return utf8_sequence(text, at, c) > 0 ? c : U'\uFFFD';
}

/// The code point that ends at `end` of valid UTF-8 `text` (end > 0).
char32_t code_point_before(std::string_view text, std::size_t end) {
  return code_point_at(text, previous_start(text, end));
}

/// Where the whitespace that ends text[0, end) starts.
std::size_t space_run_start(std::string_view text, std::size_t end) {
  while (end > 0 && is_unicode_space(code_point_before(text, end)))
    end = previous_start(text, end);
  return end;
}

/// Where the whitespace that starts at `at` ends.
std::size_t space_run_end(std::string_view text, std::size_t at) {
  while (at < text.size()) {
    char32_t c = 0;
    const int length = utf8_sequence(text, at, c);
    if (length == 0 || !is_unicode_space(c)) break;
    at += static_cast<std::size_t>(length);
  }
  return at;
}

}  // namespace

bool is_unicode_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

namespace {

/// A one-character Unicode class compiled by PCRE2 (anchored), shared by the threads.
class UnicodeClass {
 public:
  explicit UnicodeClass(const char* pattern) {
    int error = 0;
    PCRE2_SIZE offset = 0;
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern), PCRE2_ZERO_TERMINATED,
                          PCRE2_UTF | PCRE2_ANCHORED, &error, &offset, nullptr);
  }
  ~UnicodeClass() { pcre2_code_free(code_); }
  UnicodeClass(const UnicodeClass&) = delete;
  UnicodeClass& operator=(const UnicodeClass&) = delete;
  bool contains(char32_t c) const {
    thread_local std::unique_ptr<pcre2_match_data, void (*)(pcre2_match_data*)> data(
        pcre2_match_data_create(1, nullptr), pcre2_match_data_free);
    std::string encoded;
    append_utf8(encoded, c);
    return code_ != nullptr &&
           pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(encoded.data()), encoded.size(), 0,
                       PCRE2_NO_UTF_CHECK, data.get(), nullptr) > 0;
  }

 private:
  pcre2_code* code_ = nullptr;
};

}  // namespace

bool is_unicode_word(char32_t c) {
  if (c < 0x80) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
  }
  static const UnicodeClass word(R"([\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\x{200C}\x{200D}])");
  return word.contains(c);
}

bool is_unicode_numeric(char32_t c) {
  if (c < 0x80) return c >= '0' && c <= '9';
  static const UnicodeClass numeric(R"(\p{N})");
  return numeric.contains(c);
}

AddedTokenMatcher::AddedTokenMatcher(const std::vector<AddedToken>& tokens) : tokens_(tokens) {
  edges_.emplace_back();
  depth_.push_back(0);
  output_.push_back(-1);
  for (std::size_t t = 0; t < tokens_.size(); ++t) {
    std::int32_t state = kRoot;
    for (const char ch : tokens_[t].content) {
      const auto byte = static_cast<unsigned char>(ch);
      auto& edges = edges_[static_cast<std::size_t>(state)];
      const auto at = std::lower_bound(edges.begin(), edges.end(), byte,
                                       [](const Edge& e, unsigned char b) { return e.byte < b; });
      if (at != edges.end() && at->byte == byte) {
        state = at->to;
        continue;
      }
      const auto next = static_cast<std::int32_t>(edges_.size());
      edges.insert(at, Edge{byte, next});
      edges_.emplace_back();
      depth_.push_back(depth_[static_cast<std::size_t>(state)] + 1);
      output_.push_back(-1);
      state = next;
    }
    // Two tokens with one content: the first is the one matched.
    if (output_[static_cast<std::size_t>(state)] < 0)
      output_[static_cast<std::size_t>(state)] = static_cast<std::int32_t>(t);
  }
  root_.assign(256, kRoot);
  for (const Edge& e : edges_[kRoot])
    root_[e.byte] = e.to;
  // Failure links breadth first; a state without a token of its own outputs its failure's.
  fail_.assign(edges_.size(), kRoot);
  std::deque<std::int32_t> queue;
  for (const Edge& e : edges_[kRoot])
    queue.push_back(e.to);
  while (!queue.empty()) {
    const std::int32_t state = queue.front();
    queue.pop_front();
    for (const Edge& e : edges_[static_cast<std::size_t>(state)]) {
      const std::int32_t fallback = step(fail_[static_cast<std::size_t>(state)], e.byte);
      fail_[static_cast<std::size_t>(e.to)] = fallback;
      if (output_[static_cast<std::size_t>(e.to)] < 0)
        output_[static_cast<std::size_t>(e.to)] = output_[static_cast<std::size_t>(fallback)];
      queue.push_back(e.to);
    }
  }
}

std::int32_t AddedTokenMatcher::step(std::int32_t state, unsigned char byte) const {
  while (state != kRoot) {
    const auto& edges = edges_[static_cast<std::size_t>(state)];
    const auto at = std::lower_bound(edges.begin(), edges.end(), byte,
                                     [](const Edge& e, unsigned char b) { return e.byte < b; });
    if (at != edges.end() && at->byte == byte) return at->to;
    state = fail_[static_cast<std::size_t>(state)];
  }
  return root_[byte];
}

AddedTokenMatcher::Match AddedTokenMatcher::next_match(std::string_view text,
                                                       std::size_t from) const {
  Match best;
  std::int32_t state = kRoot;
  for (std::size_t i = from; i < text.size(); ++i) {
    state = step(state, static_cast<unsigned char>(text[i]));
    const std::size_t end = i + 1;
    // Every later match lies within a suffix of this state's string: once that starts past the
    // best start, nothing further left or longer can come.
    if (best.token >= 0 &&
        end - static_cast<std::size_t>(depth_[static_cast<std::size_t>(state)]) > best.begin)
      break;
    const std::int32_t token = output_[static_cast<std::size_t>(state)];
    if (token < 0) continue;
    const std::size_t begin = end - tokens_[static_cast<std::size_t>(token)].content.size();
    if (best.token < 0 || begin < best.begin || (begin == best.begin && end > best.end))
      best = Match{begin, end, token};
  }
  return best;
}

std::vector<TextSpan> AddedTokenMatcher::split(std::string_view text) const {
  std::vector<TextSpan> spans;
  std::size_t covered = 0;  // the end of the last span
  std::size_t from = 0;     // where the next search starts: the end of the last match found
  while (!tokens_.empty() && from < text.size()) {
    const Match match = next_match(text, from);
    if (match.token < 0) break;
    from = match.end;
    const AddedToken& token = tokens_[static_cast<std::size_t>(match.token)];
    if (token.single_word &&
        ((match.begin > 0 && is_unicode_word(code_point_before(text, match.begin))) ||
         (match.end < text.size() && is_unicode_word(code_point_at(text, match.end))))) {
      continue;  // inside a word: text
    }
    std::size_t begin = match.begin;
    std::size_t end = match.end;
    if (token.lstrip) begin = std::max(space_run_start(text, begin), covered);
    if (token.rstrip) end = space_run_end(text, end);
    begin = std::max(begin, covered);
    if (covered < begin) spans.push_back({covered, begin, -1});
    spans.push_back({begin, end, match.token});
    covered = end;
  }
  if (covered < text.size()) spans.push_back({covered, text.size(), -1});
  return spans;
}

}  // namespace meshtensor::tokenize
