#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

namespace meshtensor {

/// Tensor storage of at least this many bytes comes from pages of its own (see
/// allocate_storage); smaller storage comes from the heap.
inline constexpr std::size_t kPagedStorageBytes = std::size_t{1} << 20;

/// `bytes` of 64-byte-aligned memory for a tensor (at least one byte), zero-filled when
/// `zeroed`. Blocks of kPagedStorageBytes or more are mapped pages (2 MiB-aligned and advised as
/// transparent huge pages from 2 MiB up). A freed block waits in a cache for the next request of
/// its size (rounded up to 64 KiB), since a training step frees and allocates the same buffers
/// every step and fresh pages must be faulted in and zeroed. The cache holds at most
/// max(64 MiB, P + max(P/16, 32 MiB) - L), P the most paged storage live at once so far and L
/// what is live now, its oldest blocks handed back to the system first: the backward's freed
/// activations wait for the next forward, while live and cached bytes together stay within 1/16
/// above the peak (or 32 MiB above it, or 64 MiB above what is live), so the resident size
/// follows the bytes tensors use instead of the heap's fragmentation. The 32 MiB lets a small
/// model's step, whose blocks of different sizes are not all live at once, find every block it
/// needs in the cache. When the system refuses a mapping (a memory or address-space limit), every
/// cached block is handed back and the mapping tried once more; a second refusal throws
/// std::bad_alloc, as the heap would. Thread-safe. Under AddressSanitizer every block comes from
/// the heap, where the sanitizer watches its bounds.
std::shared_ptr<std::byte[]> allocate_storage(std::size_t bytes, bool zeroed);

/// What the paged storage holds now, in bytes and blocks.
struct PagedStorageStats {
  std::int64_t live_bytes = 0;         ///< in tensors now
  std::int64_t peak_live_bytes = 0;    ///< the most in tensors at once so far
  std::int64_t cached_bytes = 0;       ///< freed, waiting in the cache
  std::int64_t cache_limit_bytes = 0;  ///< what the cache could hold at the last change
  std::int64_t mapped_blocks = 0;      ///< blocks mapped fresh from the system so far
  std::int64_t reused_blocks = 0;      ///< requests served from the cache so far
};

/// The paged storage's counters (all zero under AddressSanitizer).
PagedStorageStats paged_storage_stats();

/// Hands every block waiting in the cache back to the system and returns their bytes (as
/// torch.cuda.empty_cache does for its cache); tensors in use are untouched. For a program that is
/// done with a large model and goes on to other work: the cache otherwise keeps up to the peak.
std::int64_t release_cached_storage();

/// Whether blocks of kPagedStorageBytes or more come from the paged storage in this build
/// (false under AddressSanitizer).
bool paged_storage_enabled();

}  // namespace meshtensor
