#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include <meshtensor/comm/communicator.hpp>
#include <meshtensor/comm/threads_backend.hpp>

namespace meshtensor::cli {

/// Where a command's ranks run.
enum class Backend : std::uint8_t {
  threads,  ///< every rank a thread of this process
  mpi,      ///< this process is one rank of an mpirun job
};

/// "threads" or "mpi"; ParseError naming the text otherwise.
Backend parse_backend(const std::string& text);

/// Runs `body(world)` on every rank of `backend`: `ranks` threads of this process, or this
/// process's rank of the mpirun job. On mpi the ranks first check that they all run the same
/// `command` (its canonical text): a rank started with other options would otherwise run its own
/// plan against theirs, hang, or report OK on mismatched settings. From then on any error on any
/// rank prints its cause, naming the rank, and ends the whole job at once (exit status 2 for a
/// meshtensor::Error, 3 otherwise). `body` prints on world rank 0. `network` simulates links and
/// hosts on the threads backend (ignored on mpi, which has real ones and detects its hosts).
void run_ranks(Backend backend, std::int64_t ranks, const std::string& command,
               const std::function<void(comm::Communicator& world)>& body,
               comm::SimulatedNetwork network = {});

}  // namespace meshtensor::cli
