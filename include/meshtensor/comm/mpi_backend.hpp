#pragma once

#include <functional>
#include <memory>
#include <string>

#include <meshtensor/comm/communicator.hpp>

namespace meshtensor::comm {

namespace detail {
struct MpiShared;
}

/// Options of the mpi backend.
struct MpiOptions {
  /// Check mode: before each collective the group exchanges the calls' fingerprints (kind,
  /// dtype, op, mode, counts, sequence number); ranks that disagree fail with a DesyncError
  /// naming both sides instead of hanging or mixing data. Also on when the environment sets
  /// MESHTENSOR_CHECK_COLLECTIVES=1.
  bool check_collectives = false;
};

/// The processes of an mpirun job as the ranks of a world (OpenMPI; one process per rank, one or
/// many machines). Create one per process: it initialises MPI with MPI_THREAD_MULTIPLE, since
/// each group runs its collectives on its own queue thread, and finalises MPI when destroyed.
///
/// Failure behaviour: a collective that fails (a desync in check mode, an MPI error) or outlives
/// its timeout prints `meshtensor: error: <message>` on stderr and aborts the whole job with
/// exit status 1; it never hangs silently. Argument errors are still thrown on the calling
/// rank before anything communicates.
class MpiWorld {
 public:
  /// Initialises MPI; throws CommError when MPI is already initialised by someone else or
  /// cannot provide MPI_THREAD_MULTIPLE.
  MpiWorld(int* argc, char*** argv, MpiOptions options = {});
  MpiWorld(const MpiWorld&) = delete;
  MpiWorld& operator=(const MpiWorld&) = delete;
  /// Drains the world communicator's queue and finalises MPI. Drop every communicator first.
  ~MpiWorld();

  /// This process's rank in the job.
  int rank() const;
  /// Number of processes in the job.
  int size() const;
  /// The communicator of the whole job.
  std::shared_ptr<Communicator> communicator() const;
  /// Prints `message` as meshtensor's error line on stderr and aborts every process of the job
  /// with exit status `status`.
  [[noreturn]] void abort(const std::string& message, int status = 1) const;

 private:
  std::shared_ptr<detail::MpiShared> shared_;
  std::shared_ptr<Communicator> world_;
};

/// Runs `body(world communicator)` on this process's rank of an mpirun job and returns 0; when
/// `body` throws, the job aborts with the rank and the message.
int run_mpi(int* argc, char*** argv, const std::function<void(Communicator&)>& body,
            MpiOptions options = {});

}  // namespace meshtensor::comm
