#include "file_io.hpp"

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <sys/stat.h>
#include <system_error>
#include <unistd.h>

#include <fmt/format.h>

#include <meshtensor/core/error.hpp>

namespace meshtensor::checkpoint::io {

namespace {

[[noreturn]] void fail(const std::string& what, const std::string& path, int error) {
  throw DataError(fmt::format("{} {}: {}", what, path, std::strerror(error)));
}

std::string parent_of(const std::string& path) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  return parent.empty() ? std::string(".") : parent.string();
}

}  // namespace

std::string describe_file_type(unsigned mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISLNK(mode)) return "a symbolic link";
  return S_ISREG(mode) ? "a regular file" : "a special file";
}

File File::open_read(const std::string& path) {
  // Non-blocking, so that a FIFO in a file's place is refused below instead of blocking here.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) fail("cannot open", path, errno);
  struct stat info {};
  if (::fstat(fd, &info) != 0) {
    const int error = errno;
    ::close(fd);
    fail("cannot stat", path, error);
  }
  if (!S_ISREG(info.st_mode)) {
    ::close(fd);
    throw DataError(fmt::format("cannot read {}: it is {}, not a regular file", path,
                                describe_file_type(info.st_mode)));
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return File(fd, path);
}

File File::create(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) fail("cannot create", path, errno);
  return File(fd, path);
}

File::File(File&& other) noexcept : fd_(other.fd_), path_(std::move(other.path_)) {
  other.fd_ = -1;
}

File& File::operator=(File&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.fd_;
    path_ = std::move(other.path_);
    other.fd_ = -1;
  }
  return *this;
}

File::~File() {
  if (fd_ >= 0) ::close(fd_);
}

std::int64_t File::size() const {
  struct stat info {};
  if (::fstat(fd_, &info) != 0) fail("cannot stat", path_, errno);
  return static_cast<std::int64_t>(info.st_size);
}

void File::read_at(std::int64_t offset, std::span<std::byte> out) const {
  std::size_t done = 0;
  while (done < out.size()) {
    const ssize_t got = ::pread(fd_, out.data() + done, out.size() - done,
                                static_cast<off_t>(offset + static_cast<std::int64_t>(done)));
    if (got < 0) {
      if (errno == EINTR) continue;
      fail("cannot read", path_, errno);
    }
    if (got == 0) {
      throw DataError(
          fmt::format("{} ends at byte {}, before the {} bytes at offset {} (truncated)", path_,
                      offset + static_cast<std::int64_t>(done), out.size(), offset));
    }
    done += static_cast<std::size_t>(got);
  }
}

void File::write(std::span<const std::byte> bytes) {
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t wrote = ::write(fd_, bytes.data() + done, bytes.size() - done);
    if (wrote < 0) {
      if (errno == EINTR) continue;
      fail("cannot write", path_, errno);
    }
    done += static_cast<std::size_t>(wrote);
  }
}

void File::sync() {
  if (::fsync(fd_) != 0) fail("cannot sync", path_, errno);
}

void File::close() {
  const int fd = fd_;
  fd_ = -1;
  if (fd >= 0 && ::close(fd) != 0) fail("cannot close", path_, errno);
}

std::string read_text(const std::string& path, std::int64_t max_bytes) {
  const File file = File::open_read(path);
  if (file.size() > max_bytes) {
    throw DataError(fmt::format("{} is {} bytes, more than the {} this reader accepts", path,
                                file.size(), max_bytes));
  }
  std::string text(static_cast<std::size_t>(file.size()), '\0');
  file.read_at(0, std::as_writable_bytes(std::span<char>(text)));
  return text;
}

File File::create_temporary_beside(const std::string& path) {
  const std::filesystem::path target(path);
  std::string pattern = (std::filesystem::path(parent_of(path)) /
                         fmt::format(".{}.tmp-XXXXXX", target.filename().string()))
                            .string();
  const int fd = ::mkstemp(pattern.data());
  if (fd < 0) fail("cannot create a temporary file beside", path, errno);
  ::fchmod(fd, 0644);
  return File(fd, pattern);
}

void write_text_atomically(const std::string& path, const std::string& text) {
  File file = File::create_temporary_beside(path);
  const std::string temporary = file.path();
  try {
    file.write(std::as_bytes(std::span<const char>(text)));
    file.sync();
    file.close();
    rename_durably(temporary, path);
  } catch (...) {
    ::unlink(temporary.c_str());
    throw;
  }
}

void make_directories(const std::string& path) {
  std::error_code error;
  std::filesystem::create_directories(path, error);
  if (error) throw DataError(fmt::format("cannot create directory {}: {}", path, error.message()));
}

void sync_directory(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) fail("cannot open directory", path, errno);
  const int result = ::fsync(fd);
  const int error = errno;
  ::close(fd);
  if (result != 0) fail("cannot sync directory", path, error);
}

void rename_durably(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) != 0)
    throw DataError(fmt::format("cannot rename {} to {}: {}", from, to, std::strerror(errno)));
  sync_directory(parent_of(to));
}

bool is_regular_file(const std::string& path) {
  struct stat info {};
  return ::stat(path.c_str(), &info) == 0 && S_ISREG(info.st_mode);
}

bool exists(const std::string& path) {
  struct stat info {};
  return ::stat(path.c_str(), &info) == 0;
}

std::vector<std::string> list_directory(const std::string& path) {
  std::vector<std::string> names;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(path, error))
    names.push_back(entry.path().filename().string());
  return names;
}

void remove_all(const std::string& path) {
  std::error_code error;
  std::filesystem::remove_all(path, error);
  if (error) throw DataError(fmt::format("cannot remove {}: {}", path, error.message()));
}

}  // namespace meshtensor::checkpoint::io
