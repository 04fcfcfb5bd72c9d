#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <malloc.h>
#include <sstream>
#include <sys/resource.h>
#include <unistd.h>

#include <fmt/format.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/core/memory.hpp>

namespace meshtensor {

namespace {
constexpr std::int64_t kUnlimited = std::numeric_limits<std::int64_t>::max();

// The first integer in `path` (a value of "max" or an unreadable file: unlimited).
std::int64_t read_number(const char* path) {
  std::ifstream in(path);
  std::string text;
  if (!(in >> text)) return kUnlimited;
  try {
    std::size_t used = 0;
    const long long value = std::stoll(text, &used);
    return used == text.size() && value >= 0 ? value : kUnlimited;
  } catch (const std::exception&) {
    return kUnlimited;
  }
}

// "MemAvailable:  123456 kB" from /proc/meminfo.
std::int64_t system_available() {
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string key;
    long long kib = 0;
    if (fields >> key >> kib && key == "MemAvailable:")
      return static_cast<std::int64_t>(kib) * 1024;
  }
  return kUnlimited;
}

// Room under the cgroup's memory limit (v2, then v1).
std::int64_t cgroup_room() {
  for (const auto& [limit_path, usage_path] :
       {std::pair{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"},
        std::pair{"/sys/fs/cgroup/memory/memory.limit_in_bytes",
                  "/sys/fs/cgroup/memory/memory.usage_in_bytes"}}) {
    const std::int64_t limit = read_number(limit_path);
    if (limit == kUnlimited) continue;
    const std::int64_t usage = read_number(usage_path);
    return usage == kUnlimited ? limit : std::max<std::int64_t>(0, limit - usage);
  }
  return kUnlimited;
}

// Room under an rlimit, given what the process uses of it now.
std::int64_t rlimit_room(int resource, std::int64_t used) {
  rlimit limit{};
  if (getrlimit(resource, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return kUnlimited;
  const auto cap =
      static_cast<std::int64_t>(std::min<rlim_t>(limit.rlim_cur, static_cast<rlim_t>(kUnlimited)));
  return std::max<std::int64_t>(0, cap - used);
}

// Virtual size of this process (/proc/self/statm, pages).
std::int64_t virtual_size() {
  std::ifstream in("/proc/self/statm");
  long long pages = 0;
  if (!(in >> pages)) return 0;
  return static_cast<std::int64_t>(pages) * sysconf(_SC_PAGESIZE);
}
}  // namespace

std::int64_t available_memory_bytes() {
  const std::int64_t vsize = virtual_size();
  return std::min({system_available(), cgroup_room(), rlimit_room(RLIMIT_AS, vsize),
                   rlimit_room(RLIMIT_DATA, vsize)});
}

std::string format_bytes(double bytes) {
  constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int unit = 0;
  while (std::fabs(bytes) >= 1024 && unit < 6) {
    bytes /= 1024;
    ++unit;
  }
  return unit == 0 ? fmt::format("{:.0f} B", bytes) : fmt::format("{:.1f} {}", bytes, kUnits[unit]);
}

void require_memory(double bytes, std::string_view what) {
  const std::int64_t available = available_memory_bytes();
  if (bytes > static_cast<double>(available)) {
    throw ResourceError(fmt::format("{} needs about {} of memory, but only {} is available", what,
                                    format_bytes(bytes),
                                    format_bytes(static_cast<double>(available))));
  }
}

std::int64_t peak_resident_bytes() {
  rusage usage{};
  if (getrusage(RUSAGE_SELF, &usage) != 0) return 0;
  return static_cast<std::int64_t>(usage.ru_maxrss) * 1024;  // Linux reports KiB
}

void keep_freed_memory_for_reuse() {
  constexpr int kReusedBlockBytes = 256 << 20;
  // Failing to set either only costs speed.
  (void)mallopt(M_MMAP_THRESHOLD, kReusedBlockBytes);
  (void)mallopt(M_TRIM_THRESHOLD, kReusedBlockBytes * 4);
}

}  // namespace meshtensor
