#include <algorithm>
#include <filesystem>
#include <fstream>
#include <system_error>

#include <fmt/format.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/core/file.hpp>
#include <meshtensor/core/memory.hpp>
#include <meshtensor/core/utf8.hpp>
#include <meshtensor/train/text_data.hpp>

namespace meshtensor::train {

namespace {

constexpr std::int64_t kValidationEvery = 20;

/// The length of the UTF-8 text sequence starting at bytes[i] (1 to 4), or 0 if none starts
/// there: NUL is not text.
int sequence_length(std::string_view bytes, std::size_t i) {
  char32_t code_point = 0;
  return bytes[i] == '\0' ? 0 : utf8_sequence(bytes, i, code_point);
}

std::string read_file(const std::filesystem::path& path) {
  return read_regular_file(path.string(), kMaxTextBytes, "text a corpus reads");
}

/// True when `line` (without its newline) is fortune's record separator.
bool is_separator(std::string_view line) {
  return line == "%" || line == "%\r";
}

bool is_blank(std::string_view line) {
  return line.find_first_not_of(" \t\r") == std::string_view::npos;
}

/// Refuses text that would not fit in memory, then reserves the training text: a corpus of
/// `bytes` peaks at the file being read plus the corpus (about twice the text), never at the
/// doublings of a growing string.
void reserve_corpus(const std::string& path, std::uintmax_t bytes, TextCorpus& corpus) {
  require_memory(2.2 * static_cast<double>(bytes), fmt::format("reading the text {}", path));
  corpus.train.reserve(static_cast<std::size_t>(bytes + bytes / 8 + 64));
}

}  // namespace

std::int64_t first_non_text_byte(std::string_view bytes) {
  for (std::size_t i = 0; i < bytes.size();) {
    const int length = sequence_length(bytes, i);
    if (length == 0) return static_cast<std::int64_t>(i);
    i += static_cast<std::size_t>(length);
  }
  return -1;
}

std::string printable_text(std::string_view bytes) {
  std::string out;
  for (std::size_t i = 0; i < bytes.size();) {
    const int length = sequence_length(bytes, i);
    const auto byte = static_cast<unsigned char>(bytes[i]);
    if (length == 0) {
      out += "\xEF\xBF\xBD";  // U+FFFD for a byte outside valid UTF-8 (NUL included)
      ++i;
    } else if (length == 1 && (byte < 0x20 || byte == 0x7F) && byte != '\n' && byte != '\t') {
      out += fmt::format("\\x{:02x}", byte);  // a control character: shown, never acted on
      ++i;
    } else {
      out.append(bytes.substr(i, static_cast<std::size_t>(length)));
      i += static_cast<std::size_t>(length);
    }
  }
  return out;
}

void add_text_records(std::string_view text, TextCorpus& corpus) {
  bool fortune_format = false;
  for (std::size_t start = 0; start < text.size();) {
    const std::size_t end = std::min(text.find('\n', start), text.size());
    if (is_separator(text.substr(start, end - start))) {
      fortune_format = true;
      break;
    }
    start = end + 1;
  }
  // A record is the text from its first line to the end of its last line: appended straight
  // from `text`, never copied on its own, so a corpus of one huge record costs no third copy.
  std::size_t record_begin = std::string_view::npos;
  std::size_t record_end = 0;
  const auto finish = [&] {
    if (record_begin == std::string_view::npos) return;
    const std::string_view record = text.substr(record_begin, record_end - record_begin);
    record_begin = std::string_view::npos;
    if (record.find_first_not_of(" \t\r\n") == std::string_view::npos) return;
    std::string& target = corpus.records % kValidationEvery == kValidationEvery - 1
                              ? corpus.validation
                              : corpus.train;
    target += record;
    if (record.back() != '\n') target += '\n';
    target += "%\n";
    ++corpus.records;
  };
  for (std::size_t start = 0; start < text.size();) {
    const std::size_t newline = text.find('\n', start);
    const std::size_t end = newline == std::string_view::npos ? text.size() : newline;
    const std::string_view line = text.substr(start, end - start);
    const bool boundary = fortune_format ? is_separator(line) : is_blank(line);
    if (boundary) {
      finish();
    } else {
      if (record_begin == std::string_view::npos) record_begin = start;
      record_end = std::min(end + 1, text.size());
    }
    start = end + 1;
  }
  finish();
}

TextCorpus load_text(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code error;
  const fs::file_status status = fs::status(path, error);
  if (error || !fs::exists(status)) {
    throw DataError(fmt::format("{}: no such file or directory{}", path,
                                error ? " (" + error.message() + ")" : std::string()));
  }
  TextCorpus corpus;
  std::int64_t total = 0;
  const auto add_file = [&](const fs::path& file, bool skip_binary) {
    std::string text = read_file(file);
    total += static_cast<std::int64_t>(text.size());
    if (total > kMaxTextBytes) {
      throw DataError(
          fmt::format("{}: more than the {} bytes of text a corpus reads", path, kMaxTextBytes));
    }
    const std::int64_t bad = first_non_text_byte(text);
    if (bad >= 0) {
      if (skip_binary) {
        ++corpus.skipped;
        return;
      }
      throw DataError(fmt::format(
          "{}: not UTF-8 text (byte {} at offset {} is not)", file.string(),
          static_cast<int>(static_cast<unsigned char>(text[static_cast<std::size_t>(bad)])), bad));
    }
    ++corpus.files;
    add_text_records(text, corpus);
  };
  if (fs::is_directory(status)) {
    std::vector<fs::path> files;
    std::uintmax_t bytes = 0;
    for (const fs::directory_entry& entry : fs::directory_iterator(path, error)) {
      const std::string name = entry.path().filename().string();
      if (name.empty() || name[0] == '.' || entry.is_symlink() || !entry.is_regular_file())
        continue;
      files.push_back(entry.path());
      bytes += entry.file_size(error);
    }
    if (error)
      throw DataError(fmt::format("{}: cannot list the directory: {}", path, error.message()));
    reserve_corpus(path, std::min<std::uintmax_t>(bytes, kMaxTextBytes), corpus);
    std::sort(files.begin(), files.end());
    for (const fs::path& file : files)
      add_file(file, /*skip_binary=*/true);
    if (corpus.files == 0) {
      throw DataError(fmt::format("{}: the directory holds no UTF-8 text file ({} other file(s))",
                                  path, corpus.skipped));
    }
  } else {
    if (!fs::is_regular_file(status)) {
      throw DataError(fmt::format("{}: not a text file or a directory of them (it is a {})", path,
                                  special_file_kind(status)));
    }
    reserve_corpus(path, std::min<std::uintmax_t>(fs::file_size(path, error), kMaxTextBytes),
                   corpus);
    add_file(path, /*skip_binary=*/false);
  }
  if (corpus.records == 0)
    throw DataError(
        fmt::format("{}: the text is empty (no record with a visible character)", path));
  return corpus;
}

}  // namespace meshtensor::train
