#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

namespace meshtensor {

/// "FIFO", "character device", "block device", "socket", "directory" or "special file": what a
/// path that is not a regular file is, for an error message.
const char* special_file_kind(const std::filesystem::file_status& status);

/// The whole of the regular file `path`, at most `max_bytes` long. DataError naming the path:
/// missing or unreadable, a FIFO, device, socket or directory (never opened: a FIFO would block
/// and a device never end), more than `max_bytes` (`what` says what the bytes are for).
/// All of standard input (`reader` names who reads it in the error): DataError past
/// `max_bytes`. A regular file on standard input is read into one allocation of its size.
std::string read_standard_input(std::size_t max_bytes, std::string_view reader);

std::string read_regular_file(const std::string& path, std::int64_t max_bytes,
                              std::string_view what);

}  // namespace meshtensor
