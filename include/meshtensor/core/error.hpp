#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>

namespace meshtensor {

/// Root of every exception meshtensor throws. Messages name the offending value.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

/// Text that does not parse (mesh, shape, placement, dtype, ...). The message names the bad token
/// and what was expected.
class ParseError : public Error {
 public:
  explicit ParseError(const std::string& message) : Error(message) {}
};

/// A well-formed value that is not valid here (shape mismatch, dim out of range, bad spec, ...).
class InvalidArgument : public Error {
 public:
  explicit InvalidArgument(const std::string& message) : Error(message) {}
};

/// A request the machine cannot serve: more memory, threads or ranks than it has. The message
/// names what was asked for and what is there.
class ResourceError : public Error {
 public:
  explicit ResourceError(const std::string& message) : Error(message) {}
};

/// A file that is missing, unreadable, truncated or not in the expected format; the message
/// names the file and the problem.
class DataError : public Error {
 public:
  explicit DataError(const std::string& message) : Error(message) {}
};

/// A collective failed: another rank failed first (the message carries its cause), the job was
/// aborted, or the ranks' calls did not fit together.
class CommError : public Error {
 public:
  explicit CommError(const std::string& message) : Error(message) {}
};

/// A collective did not complete within its timeout; the message names the group, the call and
/// the ranks that never arrived.
class TimeoutError : public CommError {
 public:
  explicit TimeoutError(const std::string& message) : CommError(message) {}
};

/// Ranks issued different collectives at the same position of a group's sequence; the message
/// names both sides.
class DesyncError : public CommError {
 public:
  explicit DesyncError(const std::string& message) : CommError(message) {}
};

/// A bounded excerpt of a list for a message: the first `shown` values joined by ",", then
/// ", ... and N more" when there are more (a message never grows with its input).
std::string list_excerpt(std::span<const std::int64_t> values, std::size_t shown = 16);

/// Library messages name a setting by its field in backquotes (`micro_batches`); each front end
/// gives it by its own name (the command line's --micro-batches, Python's micro_batches).
/// `message` with every backquoted field name (lower case, digits, '_') replaced by
/// name_of(field); other text, other backquoted text included, unchanged.
std::string with_setting_names(std::string_view message,
                               const std::function<std::string(std::string_view)>& name_of);

}  // namespace meshtensor
