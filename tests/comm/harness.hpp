#pragma once

#include <functional>
#include <string_view>

#include <meshtensor/comm/communicator.hpp>

namespace meshtensor::testing {

/// Runs `body` on every rank of a world of `size` ranks of the backend this test binary was
/// built for: threads (one thread per rank) or mpi (the first `size` processes of the mpirun
/// job; the others skip the body). Checks inside `body` are per rank, so the same test bodies
/// run on both backends.
void run_world(int size, const std::function<void(comm::Communicator&)>& body);

/// "threads" or "mpi".
std::string_view backend_under_test();

}  // namespace meshtensor::testing
