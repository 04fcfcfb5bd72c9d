#pragma once

#include <functional>
#include <memory>
#include <string>

#include <meshtensor/comm/communicator.hpp>

namespace meshtensor::comm {

namespace detail {
struct ThreadsShared;
}

/// Most ranks a threads world runs.
inline constexpr int kMaxThreadsRanks = 4096;

/// All ranks of a job as threads of one process, exchanging through shared memory. Each rank's
/// collectives run on a queue of its own per group; a collective's calls are compared across
/// ranks before any data moves (a mismatch is a DesyncError on every rank, never a hang).
class ThreadsWorld {
 public:
  /// A world of `size` ranks (1 to kMaxThreadsRanks).
  explicit ThreadsWorld(int size);
  /// Number of ranks.
  int size() const;
  /// The communicator of the whole world for `rank`. Call once per rank and use it from that
  /// rank's thread.
  std::shared_ptr<Communicator> communicator(int rank) const;
  /// Fails every pending and future collective of this world with CommError carrying `reason`.
  void abort(const std::string& reason) const;

 private:
  std::shared_ptr<detail::ThreadsShared> shared_;
};

/// Runs `body(world communicator)` on `size` threads, one per rank, and returns when all
/// finished. When a rank throws, the world aborts with that rank's error as the cause (the other
/// ranks' collectives fail with CommError naming it) and the first error is rethrown here. A
/// thread that cannot be started (a process or memory limit) fails the world the same way and
/// throws ResourceError naming the rank.
void run_threads(int size, const std::function<void(Communicator&)>& body);

}  // namespace meshtensor::comm
