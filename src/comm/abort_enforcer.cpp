#include "abort_enforcer.hpp"

#include <array>
#include <cerrno>
#include <csignal>
#include <ctime>
#include <fstream>
#include <sstream>
#include <string>
#include <unistd.h>

#include <fmt/format.h>

namespace meshtensor::comm::detail {

namespace {

/// The command name and parent of process `pid` (from /proc), or an empty name.
std::pair<std::string, pid_t> process_of(pid_t pid) {
  std::ifstream in(fmt::format("/proc/{}/stat", pid));
  std::string stat;
  std::getline(in, stat);
  // "pid (comm) state ppid ...": comm may hold spaces and parentheses, so the last ')' ends it.
  const auto open = stat.find('(');
  const auto close = stat.rfind(')');
  if (open == std::string::npos || close == std::string::npos || close < open) return {"", 0};
  std::istringstream rest(stat.substr(close + 1));
  char state = 0;
  pid_t parent = 0;
  rest >> state >> parent;
  return {stat.substr(open + 1, close - open - 1), parent};
}

/// The process that launched this rank's job: the nearest ancestor that is OpenMPI's launcher,
/// else the parent when it is OpenMPI's daemon; 0 when neither.
pid_t launcher() {
  const pid_t parent = getppid();
  pid_t at = parent;
  for (int depth = 0; depth < 8 && at > 1; ++depth) {
    const auto [name, next] = process_of(at);
    if (name == "mpirun" || name == "mpiexec" || name == "orterun") return at;
    at = next;
  }
  return process_of(parent).first == "orted" ? parent : 0;
}

bool alive(pid_t pid) {
  return ::kill(pid, 0) == 0 || errno == EPERM;
}

void pause_tenths(int tenths) {
  const timespec step{0, 100'000'000};
  for (int i = 0; i < tenths; ++i)
    ::nanosleep(&step, nullptr);
}

}  // namespace

void enforce_abort(std::chrono::seconds grace) {
  const pid_t target = launcher();
  if (target <= 1) return;
  // Everything the child writes is made before fork: after it, only async-signal-safe calls.
  const std::string message = fmt::format(
      "meshtensor: error: the MPI launcher (pid {}) had not ended the job {} s after the abort "
      "(a host whose processes stopped does not confirm it): ending it\n",
      target, grace.count());
  const int tenths = static_cast<int>(grace.count()) * 10;
  const pid_t child = ::fork();
  if (child != 0) return;  // the rank (or a failed fork: the abort goes on without it)
  ::setsid();              // out of the rank's process group: the abort's kill does not reach it
  ::signal(SIGPIPE, SIG_IGN);  // a closed standard error must not end it before its work
  for (int i = 0; i < tenths; i += 1) {
    if (!alive(target)) ::_exit(0);
    pause_tenths(1);
  }
  if (alive(target)) {
    [[maybe_unused]] const auto written = ::write(STDERR_FILENO, message.data(), message.size());
    ::kill(target, SIGTERM);
    for (int i = 0; i < 50 && alive(target); ++i)
      pause_tenths(1);
    if (alive(target)) ::kill(target, SIGKILL);
  }
  ::_exit(0);
}

}  // namespace meshtensor::comm::detail
