// Behaviour particular to the threads backend: many ranks in one process, queues, and failure
// propagation within a process.
#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <limits>
#include <memory>
#include <numeric>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <meshtensor/comm/threads_backend.hpp>
#include <meshtensor/core/error.hpp>
#include <meshtensor/kernels/reduce.hpp>

#include "support/error_message.hpp"

namespace meshtensor::comm {
namespace {

TEST(ThreadsWorld, SixtyFourRanksReduceAndExchange) {
  constexpr int kRanks = 64;
  const std::int64_t count = 1000;
  auto input = [&](int r) { return Tensor::random_normal({count}, DType::f32, 500 + r); };
  std::vector<Tensor> inputs;
  std::vector<const std::byte*> pointers;
  for (int r = 0; r < kRanks; ++r)
    inputs.push_back(input(r));
  for (const Tensor& t : inputs)
    pointers.push_back(t.bytes().data());
  Tensor expected({count}, DType::f32);
  std::byte* target = expected.bytes().data();
  kernels::reduce_ordered(DType::f32, ReduceOp::sum, pointers,
                          std::span<std::byte* const>(&target, 1), count);
  std::atomic<int> good{0};
  run_threads(kRanks, [&](Communicator& world) {
    Tensor buffer = input(world.rank());
    world.all_reduce(buffer);
    // all_to_all: rank r sends value 100*r + j to rank j.
    Tensor send({kRanks}, DType::i32);
    for (int j = 0; j < kRanks; ++j)
      send.values<std::int32_t>()[j] = 100 * world.rank() + j;
    Tensor received({kRanks}, DType::i32);
    world.all_to_all(send, received);
    bool exchanged = true;
    for (int j = 0; j < kRanks; ++j)
      exchanged = exchanged && received.values<std::int32_t>()[j] == 100 * j + world.rank();
    if (buffer.bitwise_equal(expected) && exchanged) ++good;
  });
  EXPECT_EQ(good.load(), kRanks);
}

TEST(ThreadsQueues, WorkOnOneGroupNeverWaitsForAnotherGroup) {
  // Rank 0 queues an all_gather on group A = {0, 1} (rank 1 has not issued it yet), then one on
  // group B = {0, 2}. B must complete while A is still pending; rank 1 issues A only after rank 0
  // saw B complete, so a shared queue would deadlock (and time out) instead of passing.
  std::promise<void> b_completed;
  std::shared_future<void> b_done = b_completed.get_future().share();
  run_threads(3, [&](Communicator& world) {
    const CollectiveOptions options{.timeout = std::chrono::seconds(10)};
    const int r = world.rank();
    auto group_a = world.split(r == 2 ? -1 : 0, r, options);
    auto group_b = world.split(r == 1 ? -1 : 0, r, options);
    if (r == 0) {
      Tensor a_out({2}, DType::f32);
      Tensor b_out({2}, DType::f32);
      Work a = group_a->all_gather_async(Tensor::full({1}, DType::f32, 1), a_out, {}, options);
      Work b = group_b->all_gather_async(Tensor::full({1}, DType::f32, 2), b_out, {}, options);
      b.wait();
      EXPECT_FALSE(a.is_completed());
      b_completed.set_value();
      a.wait();
      EXPECT_EQ(b_out.values<float>()[1], 3.0f);
      EXPECT_EQ(a_out.values<float>()[1], 5.0f);
    } else if (r == 1) {
      b_done.wait();
      Tensor a_out({2}, DType::f32);
      group_a->all_gather(Tensor::full({1}, DType::f32, 5), a_out, {}, options);
    } else {
      Tensor b_out({2}, DType::f32);
      group_b->all_gather(Tensor::full({1}, DType::f32, 3), b_out, {}, options);
    }
  });
}

TEST(ThreadsFailures, MismatchedCollectivesAreADesyncErrorOnEveryRank) {
  std::atomic<int> named_both{0};
  EXPECT_THROW(run_threads(3,
                           [&](Communicator& world) {
                             Tensor buffer({4}, DType::f32);
                             const std::string message = testing::error_message([&] {
                               if (world.rank() == 2) {
                                 world.all_gather(Tensor({4}, DType::f32),
                                                  Tensor({12}, DType::f32));
                               } else {
                                 world.all_reduce(buffer);
                               }
                             });
                             if (message.find("all_reduce #0") != std::string::npos &&
                                 message.find("all_gather #0") != std::string::npos) {
                               ++named_both;
                             }
                             throw DesyncError(message);
                           }),
               DesyncError);
  EXPECT_EQ(named_both.load(), 3);
}

TEST(ThreadsFailures, MismatchedCountsAreCaughtBeforeAnyDataMoves) {
  std::atomic<int> caught{0};
  run_threads(2, [&](Communicator& world) {
    const std::int64_t n = world.rank() == 0 ? 8 : 6;
    Tensor buffer({n}, DType::f32);
    try {
      world.all_reduce(buffer);
    } catch (const DesyncError& error) {
      if (std::string(error.what()).find("8 elements") != std::string::npos) ++caught;
    }
  });
  EXPECT_EQ(caught.load(), 2);
}

TEST(ThreadsFailures, AFailingRankMakesTheOthersFailWithItsCause) {
  std::atomic<int> saw_cause{0};
  try {
    run_threads(4, [&](Communicator& world) {
      if (world.rank() == 1) throw InvalidArgument("rank one gave up");
      Tensor buffer({16}, DType::f32);
      try {
        world.all_reduce(buffer);
      } catch (const CommError& error) {
        if (std::string(error.what()).find("rank one gave up") != std::string::npos) ++saw_cause;
        throw;
      }
    });
    FAIL() << "no error";
  } catch (const InvalidArgument& error) {
    EXPECT_STREQ(error.what(), "rank one gave up") << "the root cause is rethrown";
  }
  EXPECT_EQ(saw_cause.load(), 3);
}

/// Runs a barrier with `timeout` on every rank of 3 but rank 2, which runs `absent` instead.
/// The run must throw CommError; returns how many ranks' errors contained `text`.
int barrier_errors_naming(const std::function<void()>& absent, std::chrono::milliseconds timeout,
                          const std::string& text) {
  std::atomic<int> named{0};
  EXPECT_THROW(run_threads(3,
                           [&](Communicator& world) {
                             if (world.rank() == 2) return absent();
                             try {
                               world.barrier({.timeout = timeout});
                             } catch (const CommError& error) {
                               if (std::string(error.what()).find(text) != std::string::npos)
                                 ++named;
                               throw;
                             }
                           }),
               CommError);
  return named.load();
}

TEST(ThreadsFailures, AMissingRankTimesOutNamingIt) {
  const auto alive_but_absent = [] { std::this_thread::sleep_for(std::chrono::milliseconds(600)); };
  EXPECT_GE(barrier_errors_naming(alive_but_absent, std::chrono::milliseconds(200),
                                  "world rank(s) [2] never issued it"),
            1);
}

TEST(ThreadsFailures, AMissingMemberWaitingForAThirdRankIsSaidToWait) {
  // A chain, as pipeline stages are: rank 0 waits for rank 1 on {0, 1}, rank 1 for rank 2 on
  // {1, 2}, and rank 2 is absent. Rank 0's timeout must point past rank 1, to its own wait.
  std::string said;
  EXPECT_THROW(run_threads(3,
                           [&](Communicator& world) {
                             const CollectiveOptions options{.timeout = std::chrono::seconds(10)};
                             const int r = world.rank();
                             auto first = world.split(r == 2 ? -1 : 0, r, options);
                             auto second = world.split(r == 0 ? -1 : 0, r, options);
                             if (r == 2)
                               return std::this_thread::sleep_for(std::chrono::milliseconds(800));
                             if (r == 1) return second->barrier(options);
                             try {
                               first->barrier({.timeout = std::chrono::milliseconds(300)});
                             } catch (const CommError& error) {
                               said = error.what();
                               throw;
                             }
                           }),
               CommError);
  EXPECT_THAT(said, ::testing::HasSubstr("world rank(s) [1] never issued it"));
  EXPECT_THAT(said, ::testing::HasSubstr("world rank 1 is itself waiting in barrier"));
  EXPECT_THAT(said, ::testing::HasSubstr("on group [1,2]"));
}

TEST(ThreadsFailures, ARankThatReturnsReleasesItsWaitersAtOnceNamingIt) {
  const auto start = std::chrono::steady_clock::now();
  EXPECT_GE(barrier_errors_naming([] {}, std::chrono::seconds(60), "world rank(s) [2] returned"),
            1);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
}

TEST(ThreadsFailures, ACommunicatorUsedAfterItsRunFailsAtOnce) {
  std::vector<std::shared_ptr<Communicator>> kept(2);
  run_threads(2, [&](std::shared_ptr<Communicator> world) {
    kept[static_cast<std::size_t>(world->rank())] = std::move(world);
  });
  Tensor buffer({4}, DType::f32);
  EXPECT_THAT(testing::error_message([&] { kept[0]->all_reduce(buffer); }),
              ::testing::HasSubstr("world rank 0's run has ended"));
}

TEST(ThreadsFailures, APollThatThrowsAbortsTheRunAndIsRethrown) {
  std::atomic<int> aborted{0};
  const auto poll = [] { throw ResourceError("interrupted by the test"); };
  try {
    run_threads(
        2,
        [&](const std::shared_ptr<Communicator>& world) {
          if (world->rank() == 1) {
            std::this_thread::sleep_for(std::chrono::milliseconds(300));
            return;
          }
          try {
            world->barrier({.timeout = std::chrono::seconds(60)});
          } catch (const CommError& error) {
            if (std::string(error.what()).find("interrupted by the test") != std::string::npos)
              ++aborted;
            throw;
          }
        },
        {}, poll);
    FAIL() << "no error";
  } catch (const ResourceError& error) {
    EXPECT_STREQ(error.what(), "interrupted by the test");
  }
  EXPECT_EQ(aborted.load(), 1);
}

/// One run of 2 ranks where rank 0 gives up on a collective after 1 ms and rank 1 issues it
/// `late` later (around that deadline). Rank 0's call and buffers die as its error unwinds, so a
/// late rank that still completed the group with them would read freed memory (AddressSanitizer
/// reports it). Returns true when the collective completed, checking the result.
bool abandoned_collective_round(CollectiveKind kind, std::chrono::microseconds late) {
  const CollectiveOptions give_up_soon{.timeout = std::chrono::milliseconds(1)};
  std::atomic<int> completed{0};
  try {
    run_threads(2, [&](Communicator& world) {
      if (world.rank() == 1) std::this_thread::sleep_for(late);
      auto input = std::make_unique<Tensor>(Shape{64}, DType::f32);
      auto output = std::make_unique<Tensor>(Shape{64}, DType::f32);
      input->fill(1.0);
      if (kind == CollectiveKind::all_to_all) {
        world.all_to_all(*input, *output, {32, 32}, {32, 32}, give_up_soon);
      } else {
        world.all_reduce(*input, give_up_soon);
        *output = input->clone();
      }
      const float expected = kind == CollectiveKind::all_to_all ? 1.0F : 2.0F;
      const auto values = output->values<float>();
      if (values.front() == expected && values.back() == expected) ++completed;
    });
  } catch (const CommError& error) {
    EXPECT_THAT(error.what(), ::testing::AnyOf(::testing::HasSubstr("never issued it"),
                                               ::testing::HasSubstr("was aborted")));
    return false;
  }
  EXPECT_EQ(completed.load(), 2);
  return true;
}

TEST(ThreadsFailures, AnAbandonedCollectiveIsNeverCompletedWithTheAbandonedRanksCall) {
  // The late rank arrives before, at and after the deadline; both outcomes must occur cleanly.
  int outcomes[2] = {0, 0};
  for (int round = 0; round < 200; ++round) {
    const auto late = std::chrono::microseconds(400 + (round % 20) * 80);
    const auto kind = round % 2 == 0 ? CollectiveKind::all_reduce : CollectiveKind::all_to_all;
    ++outcomes[abandoned_collective_round(kind, late) ? 1 : 0];
  }
  EXPECT_GT(outcomes[0], 0) << "no round timed out";
}

TEST(ThreadsFailures, AnInterruptDuringCollectivesEndsEveryRankCleanly) {
  for (int round = 0; round < 50; ++round) {
    std::atomic<bool> stop{false};
    const auto started = std::chrono::steady_clock::now();
    const auto poll_after = std::chrono::microseconds(200 + round * 60);
    const auto poll = [&] {
      if (std::chrono::steady_clock::now() - started > poll_after)
        throw ResourceError("KeyboardInterrupt");
    };
    EXPECT_THROW(run_threads(
                     3,
                     [&](const std::shared_ptr<Communicator>& world) {
                       Tensor buffer({256}, DType::f32);
                       while (!stop.load()) {
                         world->all_reduce(buffer, {.mode = ReductionMode::exact});
                         const auto sub = world->split(world->rank() % 2, 0, {});
                         sub->barrier();
                       }
                     },
                     {}, poll),
                 ResourceError);
  }
}

TEST(ThreadsFailures, AnInfiniteTimeoutWaitsInsteadOfExpiring) {
  EXPECT_EQ(timeout_from_seconds(std::numeric_limits<double>::infinity(), "timeout"), kNoTimeout);
  EXPECT_EQ(deadline_after(kNoTimeout), std::chrono::steady_clock::time_point::max());
  EXPECT_THAT(testing::error_message([] { (void)timeout_from_seconds(0, "timeout"); }),
              ::testing::HasSubstr("timeout must be a positive number of seconds (or inf for "
                                   "none), got 0"));
  run_threads(2, [](Communicator& world) {
    if (world.rank() == 1) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    world.barrier({.timeout = kNoTimeout});
  });
}

}  // namespace
}  // namespace meshtensor::comm
