#pragma once

#include <string>

#include <meshtensor/core/error.hpp>

namespace meshtensor::testing {

/// Runs `action` and returns the message of the meshtensor::Error it throws, or "no error".
/// Exceptions of any other type propagate (and fail the test).
template <class Action>
std::string error_message(Action&& action) {
  try {
    action();
  } catch (const Error& error) {
    return error.what();
  }
  return "no error";
}

}  // namespace meshtensor::testing
