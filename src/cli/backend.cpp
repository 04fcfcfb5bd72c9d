#include "backend.hpp"

#include <new>

#include <fmt/format.h>

#include <meshtensor/comm/agree.hpp>
#include <meshtensor/comm/mpi_backend.hpp>
#include <meshtensor/comm/threads_backend.hpp>
#include <meshtensor/core/error.hpp>

namespace meshtensor::cli {

Backend parse_backend(const std::string& text) {
  if (text == "threads") return Backend::threads;
  if (text == "mpi") return Backend::mpi;
  throw ParseError(fmt::format("unknown --backend '{}': expected threads or mpi", text));
}

void run_ranks(Backend backend, std::int64_t ranks, const std::string& command,
               const std::function<void(comm::Communicator& world)>& body,
               comm::SimulatedNetwork network) {
  if (backend == Backend::threads) {
    if (ranks < 1 || ranks > comm::kMaxThreadsRanks) {
      throw InvalidArgument(
          fmt::format("{} ranks: the threads backend runs 1 to {}", ranks, comm::kMaxThreadsRanks));
    }
    comm::run_threads(static_cast<int>(ranks), body, std::move(network));
    return;
  }
  comm::MpiWorld world(nullptr, nullptr);
  const auto fail = [&](const std::string& why, int status) {
    world.abort(fmt::format("world rank {}: {}", world.rank(), why), status);
  };
  try {
    comm::check_same_on_every_rank(*world.communicator(), "the command", command);
    body(*world.communicator());
  } catch (const Error& error) {
    fail(error.what(), 2);
  } catch (const std::bad_alloc&) {
    fail("out of memory (std::bad_alloc)", 2);
  } catch (const std::exception& error) {
    fail(fmt::format("internal error: {}", error.what()), 3);
  }
}

}  // namespace meshtensor::cli
