#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace meshtensor {

/// Bytes this process may still allocate: the least of the memory the system reports available,
/// the room left under the cgroup's memory limit and under the process's address-space and data
/// limits (RLIMIT_AS, RLIMIT_DATA). A limit that cannot be read does not count.
std::int64_t available_memory_bytes();

/// The most memory this process has had resident at once so far (getrusage's maximum resident
/// set), in bytes; 0 where the system does not say. Every rank of the threads backend shares
/// one process; under mpi it is one rank's.
std::int64_t peak_resident_bytes();

/// "1.5 GiB", "640 MiB", "12 KiB", "100 B".
std::string format_bytes(double bytes);

/// Throws ResourceError naming `what`, the bytes it needs and the bytes available, when `bytes`
/// is more than available_memory_bytes(). Commands call it before allocating, so a request too
/// big for the machine is refused instead of running out of memory halfway.
void require_memory(double bytes, std::string_view what);

/// Keeps freed heap memory in the process's heap for the next allocation instead of handing it
/// back to the system (blocks up to 256 MiB): a training step frees and allocates the same
/// buffers every step, and memory the system takes back must be faulted in and zeroed again.
/// Tensor storage of 1 MiB or more does not come from the heap: allocate_storage (storage.hpp)
/// keeps its own bounded cache of freed blocks, so the heap's fragmentation does not add to the
/// resident size.
/// Programs call it once at start (the command-line tool does; a library leaves the host
/// program's allocator alone unless asked).
void keep_freed_memory_for_reuse();

}  // namespace meshtensor
