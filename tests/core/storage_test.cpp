#include <algorithm>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <new>
#include <sys/resource.h>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include <meshtensor/core/storage.hpp>
#include <meshtensor/core/tensor.hpp>

namespace meshtensor {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

bool all_zero(const std::byte* data, std::size_t bytes) {
  return std::all_of(data, data + bytes, [](std::byte b) { return b == std::byte{0}; });
}

TEST(Storage, BlocksOfEverySizeAreAlignedAndZeroedWhenAsked) {
  for (const std::size_t bytes :
       {std::size_t{0}, std::size_t{1}, std::size_t{4000}, kMiB - 1, kMiB, 3 * kMiB + 12345}) {
    for (int round = 0; round < 2; ++round) {  // the second round may reuse a dirtied block
      auto dirty = allocate_storage(bytes, false);
      std::memset(dirty.get(), 0x5a, std::max<std::size_t>(bytes, 1));
      dirty.reset();
      auto block = allocate_storage(bytes, true);
      EXPECT_EQ(reinterpret_cast<std::uintptr_t>(block.get()) % 64, 0u) << bytes;
      EXPECT_TRUE(all_zero(block.get(), bytes)) << bytes;
    }
  }
}

TEST(Storage, AFreedLargeBlockServesTheNextRequestOfItsSize) {
  if (!paged_storage_enabled()) GTEST_SKIP() << "AddressSanitizer build: every block is heap";
  const std::size_t bytes = 3 * kMiB + 100;
  auto first = allocate_storage(bytes, false);
  const std::byte* address = first.get();
  first.reset();
  const PagedStorageStats before = paged_storage_stats();
  auto second = allocate_storage(bytes, true);
  const PagedStorageStats after = paged_storage_stats();
  EXPECT_EQ(second.get(), address);
  EXPECT_EQ(after.reused_blocks, before.reused_blocks + 1);
  EXPECT_EQ(after.mapped_blocks, before.mapped_blocks);
  EXPECT_EQ(after.cached_bytes,
            before.cached_bytes - static_cast<std::int64_t>(3 * kMiB + 64 * 1024));
}

TEST(Storage, ARequestOfAnotherSizeIsMappedFreshAndHugePageAligned) {
  if (!paged_storage_enabled()) GTEST_SKIP() << "AddressSanitizer build: every block is heap";
  allocate_storage(5 * kMiB, false).reset();
  const PagedStorageStats before = paged_storage_stats();
  auto other = allocate_storage(7 * kMiB, false);
  const PagedStorageStats after = paged_storage_stats();
  EXPECT_EQ(after.mapped_blocks, before.mapped_blocks + 1);
  EXPECT_EQ(after.reused_blocks, before.reused_blocks);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(other.get()) % (2 * kMiB), 0u);
}

TEST(Storage, TheCacheHoldsNoMoreThanItsLimitAndTheLiveBytesAreCounted) {
  if (!paged_storage_enabled()) GTEST_SKIP() << "AddressSanitizer build: every block is heap";
  const PagedStorageStats start = paged_storage_stats();
  std::vector<std::shared_ptr<std::byte[]>> blocks;
  for (int i = 0; i < 48; ++i)
    blocks.push_back(allocate_storage(4 * kMiB, false));
  const PagedStorageStats full = paged_storage_stats();
  EXPECT_EQ(full.live_bytes, start.live_bytes + 48 * static_cast<std::int64_t>(4 * kMiB));
  EXPECT_GE(full.peak_live_bytes, full.live_bytes);
  blocks.clear();
  const PagedStorageStats freed = paged_storage_stats();
  EXPECT_EQ(freed.live_bytes, start.live_bytes);
  const std::int64_t peak = freed.peak_live_bytes;
  const std::int64_t slack = std::max<std::int64_t>(peak / 16, std::int64_t{32} << 20);
  EXPECT_EQ(freed.cache_limit_bytes,
            std::max<std::int64_t>(std::int64_t{64} << 20, peak + slack - freed.live_bytes));
  EXPECT_LE(freed.cached_bytes, freed.cache_limit_bytes);
  EXPECT_GT(freed.cached_bytes, 0);
}

TEST(Storage, FreedBlocksUpToThePeakWaitForTheNextRoundOfTheSameSizes) {
  if (!paged_storage_enabled()) GTEST_SKIP() << "AddressSanitizer build: every block is heap";
  // Three rounds of 40 live blocks of 4 MiB (160 MiB, more than the 64 MiB floor): after the
  // first, every block of a round comes from the cache.
  for (int round = 0; round < 3; ++round) {
    const PagedStorageStats before = paged_storage_stats();
    std::vector<std::shared_ptr<std::byte[]>> blocks;
    for (int i = 0; i < 40; ++i)
      blocks.push_back(allocate_storage(4 * kMiB, false));
    const PagedStorageStats after = paged_storage_stats();
    if (round > 0) {
      EXPECT_EQ(after.mapped_blocks, before.mapped_blocks) << round;
      EXPECT_EQ(after.reused_blocks, before.reused_blocks + 40) << round;
    }
  }
}

/// A small model's step in a fresh process: 64 MiB of 4 MiB blocks live at the peak, then 24 MiB
/// of 3 MiB blocks after they are freed (88 MiB of blocks, 1/16 of the peak being 4 MiB). Exits 0
/// when every round after the first finds every block in the cache.
[[noreturn]] void run_rounds_of_two_sizes() {
  std::int64_t mapped_after_first_round = 0;
  for (int round = 0; round < 4; ++round) {
    for (const auto& [count, size] : {std::pair{16, 4 * kMiB}, std::pair{8, 3 * kMiB}}) {
      std::vector<std::shared_ptr<std::byte[]>> blocks;
      for (int i = 0; i < count; ++i)
        blocks.push_back(allocate_storage(size, false));
    }
    if (round == 0) mapped_after_first_round = paged_storage_stats().mapped_blocks;
  }
  std::exit(paged_storage_stats().mapped_blocks == mapped_after_first_round ? 0 : 1);
}

TEST(Storage, ASmallStepsBlocksOfTwoSizesAllWaitInTheCache) {
  if (!paged_storage_enabled()) GTEST_SKIP() << "AddressSanitizer build: every block is heap";
  // A fresh process (the threadsafe style runs this test alone): the peak is this test's own.
  ::testing::FLAGS_gtest_death_test_style = "threadsafe";
  EXPECT_EXIT(run_rounds_of_two_sizes(), ::testing::ExitedWithCode(0), "");
}

/// This process's virtual size in bytes (/proc/self/statm's first field, in pages).
std::int64_t virtual_bytes() {
  std::ifstream statm("/proc/self/statm");
  std::int64_t pages = 0;
  statm >> pages;
  return pages * 4096;
}

/// Fills the cache, limits the address space to what is mapped now, then asks for a block of
/// another size (room only once the cache is handed back) and for one beyond any room. Exits 0
/// when the first succeeds zeroed and the second throws std::bad_alloc leaving the counts as
/// they were.
[[noreturn]] void allocate_under_an_address_limit() {
  std::vector<std::shared_ptr<std::byte[]>> held;
  for (int i = 0; i < 16; ++i)  // 256 MiB live, then waiting in the cache
    held.push_back(allocate_storage(16 * kMiB, false));
  held.clear();
  const auto room = static_cast<rlim_t>(virtual_bytes() + 4 * kMiB);
  const rlimit limit{room, room};
  if (setrlimit(RLIMIT_AS, &limit) != 0) std::exit(2);
  // The cache's own limit hands back 112 MiB of it first, short of the 122 MiB needed.
  auto block = allocate_storage(120 * kMiB, true);
  if (block == nullptr || !all_zero(block.get(), 120 * kMiB)) std::exit(3);
  const std::int64_t live = paged_storage_stats().live_bytes;
  try {
    allocate_storage(std::size_t{4} << 30, false);
    std::exit(4);
  } catch (const std::bad_alloc&) {
  }
  std::exit(paged_storage_stats().live_bytes == live ? 0 : 5);
}

TEST(Storage, UnderAnAddressSpaceLimitTheCacheIsHandedBackAndARefusalThrowsBadAlloc) {
  if (!paged_storage_enabled()) GTEST_SKIP() << "AddressSanitizer build: every block is heap";
  EXPECT_EXIT(allocate_under_an_address_limit(), ::testing::ExitedWithCode(0), "");
}

TEST(Storage, ReleasingTheCacheHandsBackEveryWaitingBlockAndLeavesLiveOnesAlone) {
  if (!paged_storage_enabled()) GTEST_SKIP() << "AddressSanitizer build: every block is heap";
  auto kept = allocate_storage(2 * kMiB, false);
  std::memset(kept.get(), 7, 2 * kMiB);
  allocate_storage(6 * kMiB, false).reset();
  const std::int64_t waiting = paged_storage_stats().cached_bytes;
  ASSERT_GE(waiting, static_cast<std::int64_t>(6 * kMiB));
  EXPECT_EQ(release_cached_storage(), waiting);
  const PagedStorageStats after = paged_storage_stats();
  EXPECT_EQ(after.cached_bytes, 0);
  EXPECT_EQ(after.live_bytes, static_cast<std::int64_t>(2 * kMiB));
  EXPECT_EQ(kept[2 * kMiB - 1], std::byte{7});
  const std::int64_t mapped = after.mapped_blocks;
  allocate_storage(6 * kMiB, false).reset();  // mapped afresh: nothing waited
  EXPECT_EQ(paged_storage_stats().mapped_blocks, mapped + 1);
  EXPECT_EQ(release_cached_storage(), static_cast<std::int64_t>(6 * kMiB));
}

TEST(Storage, ThreadsAllocatingAndFreeingAtOnceLeaveTheCountsBalanced) {
  const PagedStorageStats start = paged_storage_stats();
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([t] {
      for (int i = 0; i < 200; ++i) {
        const std::size_t bytes = (1 + static_cast<std::size_t>((t + i) % 3)) * kMiB;
        auto block = allocate_storage(bytes, true);
        ASSERT_TRUE(all_zero(block.get(), bytes));
        std::memset(block.get(), t + 1, bytes);
      }
    });
  }
  for (std::thread& thread : threads)
    thread.join();
  EXPECT_EQ(paged_storage_stats().live_bytes, start.live_bytes);
}

TEST(Storage, ATensorOnAReusedBlockStartsAtZero) {
  {
    Tensor dirty = Tensor::uninitialized(Shape{512, 1024}, DType::f32);
    auto values = dirty.values<float>();
    std::fill(values.begin(), values.end(), 7.0f);
  }
  const Tensor zeros = Tensor::zeros(Shape{512, 1024}, DType::f32);
  for (const float v : zeros.values<float>())
    ASSERT_EQ(v, 0.0f);
}

}  // namespace
}  // namespace meshtensor
