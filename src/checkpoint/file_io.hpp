#pragma once

// POSIX file access for checkpoints: every failure is a DataError naming the path and the
// system's reason.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace meshtensor::checkpoint::io {

/// An open file descriptor, closed on destruction.
class File {
 public:
  /// Opens `path` for reading.
  static File open_read(const std::string& path);
  /// Creates `path` for writing; it must not exist.
  static File create(const std::string& path);
  /// Creates a new file of a unique name ".NAME.tmp-XXXXXX" in the directory of `path` (NAME:
  /// its file name), for writing; path() names it.
  static File create_temporary_beside(const std::string& path);

  File(File&& other) noexcept;
  File& operator=(File&& other) noexcept;
  File(const File&) = delete;
  File& operator=(const File&) = delete;
  ~File();

  /// Size in bytes.
  std::int64_t size() const;
  /// Reads exactly `out.size()` bytes at `offset` (DataError when the file ends first).
  void read_at(std::int64_t offset, std::span<std::byte> out) const;
  /// Appends all of `bytes`.
  void write(std::span<const std::byte> bytes);
  /// Flushes data and metadata to the disk (fsync).
  void sync();
  /// Closes, reporting a failure (a deferred write error) as DataError.
  void close();
  const std::string& path() const { return path_; }

 private:
  File(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  int fd_ = -1;
  std::string path_;
};

/// "a directory", "a FIFO", ... for a stat mode, in messages.
std::string describe_file_type(unsigned mode);
/// The whole file as bytes; DataError when it is larger than `max_bytes`.
std::string read_text(const std::string& path, std::int64_t max_bytes);
/// Writes `text` to `path` (created or replaced through a temporary of a unique name beside it,
/// then rename) and syncs it and its directory, so that after a crash the file holds either the
/// old or the new text; no other file is touched.
void write_text_atomically(const std::string& path, const std::string& text);
/// Creates the directory (parents too) when missing.
void make_directories(const std::string& path);
/// fsync of a directory: makes the entries created or renamed in it durable.
void sync_directory(const std::string& path);
/// Renames `from` to `to` (same file system) and syncs the directory holding `to`.
void rename_durably(const std::string& from, const std::string& to);
/// True when `path` is a regular file (links followed).
bool is_regular_file(const std::string& path);
/// True when `path` exists.
bool exists(const std::string& path);
/// Entries of a directory (names only; "." and ".." left out); empty when it does not exist.
std::vector<std::string> list_directory(const std::string& path);
/// Removes a file or a directory tree; missing is fine.
void remove_all(const std::string& path);

}  // namespace meshtensor::checkpoint::io
