#include <filesystem>
#include <utility>

#include <fmt/format.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/generate/prompt_source.hpp>

namespace meshtensor::generate {

PromptSource::PromptSource(std::optional<std::string> single, std::optional<std::string> path) {
  if (single && path) throw ParseError("--prompt and --prompts exclude each other: give one");
  if (!path) {
    if (!single) throw ParseError("give --prompt TEXT or --prompts FILE");
    single_ = std::move(single);
    return;
  }
  path_ = std::move(*path);
  std::error_code error;
  if (std::filesystem::is_directory(path_, error))
    throw DataError(fmt::format("--prompts {}: is a directory, not a file of prompts", path_));
  file_.open(path_, std::ios::binary);
  if (!file_) throw DataError(fmt::format("--prompts {}: cannot open the file", path_));
}

std::optional<std::string> PromptSource::next() {
  if (single_) return std::exchange(single_, std::nullopt);
  if (!file_.is_open()) return std::nullopt;
  std::string line;
  bool any = false;
  for (int c; (c = file_.get()) != std::char_traits<char>::eof();) {
    any = true;
    if (++bytes_ > kMaxPromptFileBytes) {
      throw DataError(fmt::format("--prompts {}: more than the {} bytes a prompt file may hold",
                                  path_, kMaxPromptFileBytes));
    }
    if (c == '\n') break;
    if (static_cast<std::int64_t>(line.size()) >= kMaxPromptLineBytes) {
      throw DataError(fmt::format("--prompts {}: line {} is longer than {} bytes", path_,
                                  lines_ + 1, kMaxPromptLineBytes));
    }
    line += static_cast<char>(c);
  }
  if (!any) {
    if (lines_ == 0) throw DataError(fmt::format("--prompts {} holds no line", path_));
    file_.close();
    return std::nullopt;
  }
  ++lines_;
  if (!line.empty() && line.back() == '\r') line.pop_back();
  return line;
}

}  // namespace meshtensor::generate
