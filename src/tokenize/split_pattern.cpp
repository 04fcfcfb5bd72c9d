#define PCRE2_CODE_UNIT_WIDTH 8
#include <memory>
#include <pcre2.h>

#include <fmt/format.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/tokenize/split_pattern.hpp>

namespace meshtensor::tokenize {

struct SplitPattern::Compiled {
  pcre2_code* code = nullptr;
  ~Compiled() { pcre2_code_free(code); }
};

SplitPattern::SplitPattern(std::string pattern)
    : pattern_(std::move(pattern)), compiled_(std::make_unique<Compiled>()) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  compiled_->code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern_.data()), pattern_.size(),
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
  // Match data per thread: a pattern is shared by the ranks of a process.
  thread_local std::unique_ptr<pcre2_match_data, void (*)(pcre2_match_data*)> data(
      pcre2_match_data_create(1, nullptr), pcre2_match_data_free);
  std::vector<std::string_view> out;
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
    if (start > gap) out.push_back(text.substr(gap, start - gap));
    out.push_back(text.substr(start, end - start));
    gap = end;
    at = end;
  }
  if (gap < text.size()) out.push_back(text.substr(gap));
  return out;
}

}  // namespace meshtensor::tokenize
