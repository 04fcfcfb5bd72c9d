#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace meshtensor::train {

/// Where Debian's fortunes package puts its text.
inline constexpr const char* kDefaultTextDir = "/usr/share/games/fortunes";

/// Largest text a corpus reads (all files together).
inline constexpr std::int64_t kMaxTextBytes = std::int64_t{1} << 30;

/// Byte-level tokenizer: a token is one byte of UTF-8 text (256 tokens), so any text encodes
/// and every token sequence decodes; a checkpoint records the tokenizer by this name.
inline constexpr const char* kByteTokenizer = "bytes";

/// Tokens of the byte-level tokenizer.
inline constexpr std::int64_t kByteVocabulary = 256;

/// Text split by a fixed rule into training and validation text, both byte-level tokens.
///
/// A file is cut into records: the fortunes between lines holding only "%" when the file has
/// such lines (fortune's format), otherwise paragraphs (separated by blank lines). Records are
/// numbered across all files in order (files sorted by name); every 20th record (numbers 19, 39,
/// ...) is validation text, the rest training text. Each record is kept with a "%\n" line after
/// it, so the model sees where one ends.
struct TextCorpus {
  std::string train;
  std::string validation;
  std::int64_t files = 0;    ///< text files read
  std::int64_t skipped = 0;  ///< files of a directory skipped as not UTF-8 text
  std::int64_t records = 0;  ///< fortunes or paragraphs
};

/// Reads `path`: one UTF-8 text file, or every regular file directly in a directory (symbolic
/// links and hidden files skipped; files that are not UTF-8 text, e.g. fortune's .dat indexes,
/// skipped and counted). DataError naming the path and the problem: missing, unreadable, a file
/// that is not UTF-8 text (with the offset of the first bad byte), empty text, a directory with
/// no text file, more than kMaxTextBytes.
TextCorpus load_text(const std::string& path);

/// Splits `text` into records and assigns them to `corpus` by the rule of TextCorpus, numbering
/// from corpus.records.
void add_text_records(std::string_view text, TextCorpus& corpus);

/// The byte offset of the first byte of `bytes` that is not part of valid UTF-8 text (a NUL byte
/// counts as not text), or -1 when all of it is.
std::int64_t first_non_text_byte(std::string_view bytes);

/// `bytes` as printable UTF-8 for a terminal: bytes outside valid UTF-8 (a sample cut
/// mid-character, NUL) become U+FFFD, and control characters other than newline and tab are
/// shown as \xNN, so a model's output never reaches a terminal as raw invalid bytes or escape
/// sequences. `--json` keeps the exact tokens beside it.
std::string printable_text(std::string_view bytes);

}  // namespace meshtensor::train
