#include <meshtensor/comm/threads_backend.hpp>

#include "comm/harness.hpp"

namespace meshtensor::testing {

void run_world(int size, const std::function<void(comm::Communicator&)>& body) {
  comm::run_threads(size, body);
}

std::string_view backend_under_test() {
  return "threads";
}

}  // namespace meshtensor::testing
