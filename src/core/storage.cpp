#include <algorithm>
#include <cstring>
#include <mutex>
#include <new>
#include <sys/mman.h>
#include <vector>

#include <meshtensor/core/storage.hpp>

namespace meshtensor {

namespace {

constexpr std::size_t kHeapAlignment = 64;
constexpr std::size_t kGranule = std::size_t{64} << 10;  // block sizes round up to 64 KiB
constexpr std::size_t kHugePage = std::size_t{2} << 20;
constexpr std::int64_t kMinimumCacheBytes = std::int64_t{64} << 20;
constexpr std::int64_t kMinimumSlackBytes = std::int64_t{32} << 20;

#if defined(__SANITIZE_ADDRESS__)
#define MESHTENSOR_ADDRESS_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define MESHTENSOR_ADDRESS_SANITIZER 1
#endif
#endif
#if defined(MESHTENSOR_ADDRESS_SANITIZER)
constexpr bool kPaged = false;
#else
constexpr bool kPaged = true;
#endif

std::shared_ptr<std::byte[]> heap_block(std::size_t size) {
  auto* data = new (std::align_val_t{kHeapAlignment}) std::byte[size];
  return {data, [](std::byte* p) { operator delete[](p, std::align_val_t{kHeapAlignment}); }};
}

/// Maps `size` bytes (a multiple of kGranule); from kHugePage up, 2 MiB-aligned and advised as
/// huge pages, by mapping the slack of one huge page and handing back what the alignment skips.
/// nullptr when the system refuses.
std::byte* map_block(std::size_t size) {
  const std::size_t slack = size >= kHugePage ? kHugePage : 0;
  void* mapped =
      mmap(nullptr, size + slack, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mapped == MAP_FAILED) return nullptr;
  auto* start = static_cast<std::byte*>(mapped);
  if (slack == 0) return start;
  const auto address = reinterpret_cast<std::uintptr_t>(start);
  const std::size_t skip = (kHugePage - address % kHugePage) % kHugePage;
  if (skip > 0) munmap(start, skip);
  if (slack - skip > 0) munmap(start + skip + size, slack - skip);
  (void)madvise(start + skip, size, MADV_HUGEPAGE);  // failing only costs page faults
  return start + skip;
}

/// A block from the cache, or freshly mapped (and so already zero).
struct TakenBlock {
  std::byte* data;
  bool fresh;
};

struct CachedBlock {
  std::byte* data;
  std::size_t size;
};

/// The cache of freed blocks, oldest first, and the counters.
class PagedStorage {
 public:
  TakenBlock take(std::size_t size) {
    std::vector<CachedBlock> evicted;
    {
      std::lock_guard lock(mutex_);
      stats_.live_bytes += static_cast<std::int64_t>(size);
      stats_.peak_live_bytes = std::max(stats_.peak_live_bytes, stats_.live_bytes);
      const auto found = std::find_if(cache_.begin(), cache_.end(),
                                      [&](const CachedBlock& b) { return b.size == size; });
      if (found != cache_.end()) {
        std::byte* data = found->data;
        cache_.erase(found);
        stats_.cached_bytes -= static_cast<std::int64_t>(size);
        ++stats_.reused_blocks;
        return {data, false};
      }
      ++stats_.mapped_blocks;
      evicted = evict_over_limit();
    }
    unmap(evicted);
    if (std::byte* data = map_block(size)) return {data, true};
    // Refused (a memory or address-space limit): hand back every cached block and try once more.
    release_all();
    if (std::byte* data = map_block(size)) return {data, true};
    std::lock_guard lock(mutex_);
    stats_.live_bytes -= static_cast<std::int64_t>(size);
    throw std::bad_alloc();
  }

  void give_back(std::byte* data, std::size_t size) {
    std::vector<CachedBlock> evicted;
    {
      std::lock_guard lock(mutex_);
      stats_.live_bytes -= static_cast<std::int64_t>(size);
      cache_.push_back({data, size});
      stats_.cached_bytes += static_cast<std::int64_t>(size);
      evicted = evict_over_limit();
    }
    unmap(evicted);
  }

  std::int64_t release_all() {
    std::vector<CachedBlock> cached;
    std::int64_t bytes = 0;
    {
      std::lock_guard lock(mutex_);
      cached.swap(cache_);
      bytes = stats_.cached_bytes;
      stats_.cached_bytes = 0;
    }
    unmap(cached);
    return bytes;
  }

  PagedStorageStats stats() {
    std::lock_guard lock(mutex_);
    return stats_;
  }

 private:
  /// Takes the oldest blocks out of the cache until it holds no more than its limit (the caller
  /// holds the lock and unmaps them after releasing it).
  std::vector<CachedBlock> evict_over_limit() {
    const std::int64_t peak = stats_.peak_live_bytes;
    const std::int64_t slack = std::max(peak / 16, kMinimumSlackBytes);
    stats_.cache_limit_bytes = std::max(kMinimumCacheBytes, peak + slack - stats_.live_bytes);
    std::vector<CachedBlock> evicted;
    while (stats_.cached_bytes > stats_.cache_limit_bytes) {
      evicted.push_back(cache_.front());
      stats_.cached_bytes -= static_cast<std::int64_t>(cache_.front().size);
      cache_.erase(cache_.begin());
    }
    return evicted;
  }

  static void unmap(const std::vector<CachedBlock>& blocks) {
    for (const CachedBlock& block : blocks)
      munmap(block.data, block.size);
  }

  std::mutex mutex_;
  std::vector<CachedBlock> cache_;
  PagedStorageStats stats_;
};

/// Never destroyed: tensors in static storage may be freed after every other static object.
PagedStorage& paged_storage() {
  static auto* storage = new PagedStorage();
  return *storage;
}

}  // namespace

std::shared_ptr<std::byte[]> allocate_storage(std::size_t bytes, bool zeroed) {
  const std::size_t size = std::max<std::size_t>(bytes, 1);
  if (!kPaged || size < kPagedStorageBytes) {
    auto block = heap_block(size);
    if (zeroed) std::memset(block.get(), 0, size);
    return block;
  }
  const std::size_t rounded = (size + kGranule - 1) / kGranule * kGranule;
  const TakenBlock block = paged_storage().take(rounded);
  if (zeroed && !block.fresh) std::memset(block.data, 0, size);
  return {block.data, [rounded](std::byte* p) { paged_storage().give_back(p, rounded); }};
}

PagedStorageStats paged_storage_stats() {
  return kPaged ? paged_storage().stats() : PagedStorageStats{};
}

std::int64_t release_cached_storage() {
  return kPaged ? paged_storage().release_all() : 0;
}

bool paged_storage_enabled() {
  return kPaged;
}

}  // namespace meshtensor
