#pragma once

#include <cstdint>
#include <fstream>
#include <optional>
#include <string>

namespace meshtensor::generate {

/// Longest prompt line read, and most bytes read from a file of prompts.
inline constexpr std::int64_t kMaxPromptLineBytes = std::int64_t{1} << 20;
inline constexpr std::int64_t kMaxPromptFileBytes = std::int64_t{1} << 30;

/// The prompts, one at a time: a single one, or the lines of a file (without their line ends),
/// read as they are needed, so a file of millions of prompts streams. Lines and the file are
/// capped (DataError naming the line, the file and the cap); a directory is refused at once.
class PromptSource {
 public:
  /// One of `single` (--prompt) and `path` (--prompts) is given: ParseError otherwise.
  PromptSource(std::optional<std::string> single, std::optional<std::string> path);
  /// The next prompt, or nothing at the end.
  std::optional<std::string> next();

 private:
  std::string path_;
  std::optional<std::string> single_;
  std::ifstream file_;
  std::int64_t lines_ = 0;
  std::int64_t bytes_ = 0;
};

}  // namespace meshtensor::generate
