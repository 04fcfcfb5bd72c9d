#include <fstream>
#include <iostream>
#include <sys/stat.h>
#include <system_error>
#include <unistd.h>

#include <fmt/format.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/core/file.hpp>

namespace meshtensor {

const char* special_file_kind(const std::filesystem::file_status& status) {
  namespace fs = std::filesystem;
  return fs::is_fifo(status)             ? "FIFO"
         : fs::is_character_file(status) ? "character device"
         : fs::is_block_file(status)     ? "block device"
         : fs::is_socket(status)         ? "socket"
         : fs::is_directory(status)      ? "directory"
                                         : "special file";
}

std::string read_regular_file(const std::string& path, std::int64_t max_bytes,
                              std::string_view what) {
  std::error_code error;
  const auto status = std::filesystem::status(path, error);
  if (error || !std::filesystem::exists(status))
    throw DataError(fmt::format("{}: cannot read the file: {}", path,
                                error ? error.message() : std::string("no such file")));
  if (!std::filesystem::is_regular_file(status))
    throw DataError(
        fmt::format("{}: not a regular file (it is a {})", path, special_file_kind(status)));
  const auto size = std::filesystem::file_size(path, error);
  if (error) throw DataError(fmt::format("{}: cannot read the file: {}", path, error.message()));
  if (size > static_cast<std::uintmax_t>(max_bytes)) {
    throw DataError(
        fmt::format("{}: {} bytes is more than the {} bytes of {}", path, size, max_bytes, what));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError(fmt::format("{}: cannot open the file", path));
  std::string text(static_cast<std::size_t>(size), '\0');
  in.read(text.data(), static_cast<std::streamsize>(size));
  if (in.gcount() != static_cast<std::streamsize>(size))
    throw DataError(fmt::format("{}: reading the file failed", path));
  return text;
}

std::string read_standard_input(std::size_t max_bytes, std::string_view reader) {
  std::string text;
  struct stat info {};
  if (::fstat(STDIN_FILENO, &info) == 0 && S_ISREG(info.st_mode) && info.st_size > 0 &&
      static_cast<std::size_t>(info.st_size) <= max_bytes)
    text.reserve(static_cast<std::size_t>(info.st_size) + 1);
  char buffer[1 << 16];
  while (std::cin.read(buffer, sizeof(buffer)) || std::cin.gcount() > 0) {
    text.append(buffer, static_cast<std::size_t>(std::cin.gcount()));
    if (text.size() > max_bytes) {
      throw DataError(
          fmt::format("standard input: more than the {} bytes {} reads", max_bytes, reader));
    }
  }
  return text;
}

}  // namespace meshtensor
