#define PCRE2_CODE_UNIT_WIDTH 8
#include <memory>
#include <pcre2.h>
#include <string_view>

#include <fmt/format.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/tokenize/split_pattern.hpp>

namespace meshtensor::tokenize {

struct SplitPattern::Compiled {
  pcre2_code* code = nullptr;
  ~Compiled() { pcre2_code_free(code); }
};

namespace {

/// Unicode's White_Space property as a class body: what Oniguruma (the Rust library's engine)
/// and Rust's char::is_whitespace call space. PCRE2's own \s adds U+180E, a space only before
/// Unicode 6.3.
constexpr std::string_view kWhiteSpace =
    R"(\t\n\x{0B}\f\r\x{20}\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";

/// `pattern` with \s (outside and inside classes) and \S (outside classes) spelled as
/// White_Space; every other escape and character as it was.
std::string with_white_space(std::string_view pattern) {
  std::string out;
  bool in_class = false;
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char next = pattern[++i];
      if (next == 's') {
        out += in_class ? std::string(kWhiteSpace) : "[" + std::string(kWhiteSpace) + "]";
      } else if (next == 'S' && !in_class) {
        out += "[^" + std::string(kWhiteSpace) + "]";
      } else {
        out += c;
        out += next;
      }
      continue;
    }
    if (c == '[' && !in_class) {
      in_class = true;
      out += c;
      // A ']' (or '^]') right after the opening bracket is a member, not the end.
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out += pattern[++i];
      continue;
    }
    if (c == ']' && in_class) in_class = false;
    out += c;
  }
  return out;
}

}  // namespace

SplitPattern::SplitPattern(std::string pattern)
    : pattern_(std::move(pattern)), compiled_(std::make_unique<Compiled>()) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  const std::string compiled = with_white_space(pattern_);
  compiled_->code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(compiled.data()), compiled.size(),
                    PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &error, &offset, nullptr);
  if (compiled_->code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    throw ParseError(fmt::format("pre-tokenizer pattern '{}' does not compile at offset {}: {}",
                                 pattern_, offset, reinterpret_cast<const char*>(message)));
  }
  pcre2_jit_compile(compiled_->code, PCRE2_JIT_COMPLETE);  // the interpreter if JIT is missing
}

SplitPattern::~SplitPattern() = default;
SplitPattern::SplitPattern(SplitPattern&&) noexcept = default;
SplitPattern& SplitPattern::operator=(SplitPattern&&) noexcept = default;

std::vector<std::string_view> SplitPattern::pieces(std::string_view text) const {
  std::vector<std::string_view> out;
  for_each_piece(text, [&](std::string_view piece) { out.push_back(piece); });
  return out;
}

void SplitPattern::for_each_piece(std::string_view text,
                                  const std::function<void(std::string_view)>& take) const {
  for_each_part(text, [&](std::string_view part, bool) { take(part); });
}

void SplitPattern::for_each_part(std::string_view text,
                                 const std::function<void(std::string_view, bool)>& take) const {
  // Match data per thread: a pattern is shared by the ranks of a process.
  thread_local std::unique_ptr<pcre2_match_data, void (*)(pcre2_match_data*)> data(
      pcre2_match_data_create(1, nullptr), pcre2_match_data_free);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  std::size_t at = 0;
  std::size_t gap = 0;  // start of the text no match has covered yet
  while (at <= text.size()) {
    const int found = pcre2_match(compiled_->code, subject, text.size(), at, PCRE2_NO_UTF_CHECK,
                                  data.get(), nullptr);
    if (found == PCRE2_ERROR_NOMATCH) break;
    if (found < 0) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(found, message, sizeof(message));
      throw InvalidArgument(fmt::format("pre-tokenizer pattern '{}': {}", pattern_,
                                        reinterpret_cast<const char*>(message)));
    }
    const PCRE2_SIZE* range = pcre2_get_ovector_pointer(data.get());
    const std::size_t start = range[0];
    const std::size_t end = range[1];
    if (end == start) {  // an empty match: step over one character
      if (start >= text.size()) break;
      at = start + 1;
      while (at < text.size() && (static_cast<unsigned char>(text[at]) & 0xC0) == 0x80)
        ++at;
      continue;
    }
    if (start > gap) take(text.substr(gap, start - gap), false);
    take(text.substr(start, end - start), true);
    gap = end;
    at = end;
  }
  if (gap < text.size()) take(text.substr(gap), false);
}

}  // namespace meshtensor::tokenize
