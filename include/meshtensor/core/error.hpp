#pragma once

#include <stdexcept>
#include <string>

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

}  // namespace meshtensor
