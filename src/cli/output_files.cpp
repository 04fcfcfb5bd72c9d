#include "output_files.hpp"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include <meshtensor/core/error.hpp>

namespace meshtensor::cli {

namespace {

namespace fs = std::filesystem;

/// The path with its existing part resolved (links followed), else its absolute normal form.
fs::path resolved(const std::string& path) {
  std::error_code error;
  fs::path result = fs::weakly_canonical(fs::absolute(path), error);
  if (error) return fs::absolute(path).lexically_normal();
  return result;
}

/// The (device, inode) of an existing path, to catch hard links and other names of one file.
std::optional<std::pair<dev_t, ino_t>> identity(const std::string& path) {
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) return std::nullopt;
  return std::pair{info.st_dev, info.st_ino};
}

bool same_file(const std::string& a, const std::string& b) {
  if (resolved(a) == resolved(b)) return true;
  const auto first = identity(a);
  return first && first == identity(b);
}

/// True when `inner` lies inside the directory `outer` (not equal to it).
bool lies_inside(const std::string& inner, const std::string& outer) {
  const fs::path in = resolved(inner);
  const fs::path out = resolved(outer);
  auto i = in.begin();
  for (auto o = out.begin(); o != out.end(); ++o, ++i) {
    if (o->empty()) continue;  // a trailing separator
    if (i == in.end() || *i != *o) return false;
  }
  return i != in.end();
}

[[noreturn]] void refuse(const NamedPath& output, const NamedPath& other, const char* relation,
                         const char* why = "the run would overwrite what it reads") {
  throw InvalidArgument(fmt::format("{} {} {} {} {}: {}; give {} another path", output.option,
                                    output.path, relation, other.option, other.path, why,
                                    output.option));
}

}  // namespace

void check_outputs_are_not_inputs(std::span<const NamedPath> outputs,
                                  std::span<const NamedPath> roots,
                                  std::span<const NamedPath> inputs) {
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    const NamedPath& output = outputs[i];
    if (output.path.empty()) continue;
    for (const NamedPath& input : inputs) {
      if (input.path.empty()) continue;
      if (same_file(output.path, input.path)) refuse(output, input, "is the file of");
      if (lies_inside(output.path, input.path)) refuse(output, input, "lies inside");
    }
    for (const NamedPath& root : roots) {
      if (root.path.empty()) continue;
      if (same_file(output.path, root.path)) refuse(output, root, "is the directory of");
      if (lies_inside(output.path, root.path)) refuse(output, root, "lies inside");
    }
    for (std::size_t j = i + 1; j < outputs.size(); ++j) {
      if (!outputs[j].path.empty() && same_file(output.path, outputs[j].path))
        refuse(output, outputs[j], "is also the file of", "two outputs would write one file");
    }
  }
  for (const NamedPath& root : roots) {
    if (root.path.empty()) continue;
    for (const NamedPath& input : inputs) {
      if (input.path.empty() || input.option == "--resume") continue;  // resume and save: fine
      if (same_file(root.path, input.path)) refuse(root, input, "is the directory of");
      if (lies_inside(input.path, root.path)) refuse(root, input, "holds");
      if (lies_inside(root.path, input.path) && !fs::is_directory(resolved(input.path)))
        refuse(root, input, "lies inside");
    }
  }
}

OutputFile::OutputFile(std::string option, std::string path, bool binary)
    : option_(std::move(option)), path_(std::move(path)) {
  const fs::path target(path_);
  const fs::path directory = target.has_parent_path() ? target.parent_path() : fs::path(".");
  std::error_code error;
  if (fs::is_directory(target, error)) {
    throw DataError(fmt::format("{} {}: is a directory; give a file name", option_, path_));
  }
  // A device or a pipe (/dev/stdout, /dev/null, a FIFO) cannot be replaced by a rename: it is
  // written in place, every write checked as for a file.
  struct stat info {};
  if (::stat(path_.c_str(), &info) == 0 && !S_ISREG(info.st_mode)) {
    in_place_ = true;
    stream_.open(path_, binary ? std::ios::out | std::ios::binary : std::ios::out);
    if (!stream_) {
      throw DataError(
          fmt::format("{} {}: cannot write the file: {}", option_, path_, std::strerror(errno)));
    }
    return;
  }
  std::string pattern =
      (directory / fmt::format(".{}.tmp-XXXXXX", target.filename().string())).string();
  const int fd = ::mkstemp(pattern.data());
  if (fd < 0) {
    throw DataError(
        fmt::format("{} {}: cannot write the file: {}", option_, path_, std::strerror(errno)));
  }
  ::fchmod(fd, 0644);
  ::close(fd);
  temporary_ = pattern;
  stream_.open(temporary_, binary ? std::ios::out | std::ios::binary : std::ios::out);
  if (!stream_) {
    std::remove(temporary_.c_str());
    throw DataError(fmt::format("{} {}: cannot write the file", option_, path_));
  }
}

OutputFile::~OutputFile() {
  if (committed_) return;
  stream_.close();
  if (!in_place_) std::remove(temporary_.c_str());
}

void OutputFile::commit() {
  errno = 0;
  stream_.close();
  if (!stream_) {
    throw DataError(fmt::format("{} {}: writing the file failed{}", option_, path_,
                                errno != 0 ? fmt::format(": {}", std::strerror(errno)) : ""));
  }
  if (in_place_) {
    committed_ = true;
    return;
  }
  if (std::rename(temporary_.c_str(), path_.c_str()) != 0) {
    throw DataError(
        fmt::format("{} {}: cannot replace the file: {}", option_, path_, std::strerror(errno)));
  }
  committed_ = true;
}

}  // namespace meshtensor::cli
