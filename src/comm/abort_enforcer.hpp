#pragma once

#include <chrono>

namespace meshtensor::comm::detail {

/// Makes an MPI_Abort end the job even when a host stopped answering. OpenMPI's launcher
/// (mpirun) waits for every daemon to confirm the abort; a host whose processes are stopped
/// (SIGSTOP, a frozen VM) still answers TCP keepalives, so mpirun would wait forever. Called
/// just before MPI_Abort: forks a detached process that, if the launcher is still there `grace`
/// later, ends it (SIGTERM, then SIGKILL), saying so on standard error. The launcher is the
/// nearest ancestor named mpirun, mpiexec or orterun, else the rank's own orted; a process not
/// started by OpenMPI (a singleton) has none, and nothing is forked.
void enforce_abort(std::chrono::seconds grace);

}  // namespace meshtensor::comm::detail
