#pragma once

#include <fstream>
#include <span>
#include <string>

namespace meshtensor::cli {

/// A path the user named on the command line, with the option that named it.
struct NamedPath {
  std::string option;  ///< e.g. "--log"
  std::string path;    ///< empty: the option was not given
};

/// Refuses (InvalidArgument naming both options and paths) an output that is also an input or
/// another output: an output file that is, or lies inside, an input (a data file or directory, a
/// resume root, a checkpoint root the run writes); two outputs that are the same file; a
/// checkpoint root that is a data directory or holds the data. `outputs` are files the run
/// writes; `roots` are directories it writes into (--save); `inputs` are read. Paths that do not
/// exist yet compare by their absolute, normalised form.
void check_outputs_are_not_inputs(std::span<const NamedPath> outputs,
                                  std::span<const NamedPath> roots,
                                  std::span<const NamedPath> inputs);

/// A file the run writes where the user points, created only after every input was checked:
/// written to a temporary file of a unique name beside the target and renamed over it by
/// commit(), so the user's file holds either what it held or the whole new output. Destroyed
/// without commit() (a failed run), it removes the temporary and leaves the target untouched.
/// A path that exists and is no regular file (a device such as /dev/stdout, a FIFO) is written
/// in place.
class OutputFile {
 public:
  /// Creates the temporary beside `path`; DataError naming `option`, the path and the reason.
  OutputFile(std::string option, std::string path, bool binary = false);
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;
  ~OutputFile();

  /// The stream to write to.
  std::ofstream& stream() { return stream_; }
  /// Flushes, checks every write and renames the temporary over the target.
  void commit();
  /// The path the user named.
  const std::string& path() const { return path_; }

 private:
  std::string option_;
  std::string path_;
  std::string temporary_;
  std::ofstream stream_;
  bool in_place_ = false;
  bool committed_ = false;
};

}  // namespace meshtensor::cli
