#include <atomic>
#include <future>
#include <numeric>
#include <vector>

#include <gtest/gtest.h>

#include <meshtensor/comm/mesh_groups.hpp>
#include <meshtensor/comm/threads_backend.hpp>
#include <meshtensor/core/error.hpp>
#include <meshtensor/kernels/reduce.hpp>

#include "support/error_message.hpp"

namespace meshtensor::comm {
namespace {

// Input of group rank `r`: depends only on (seed, r), so any rank can rebuild everyone's input.
Tensor input_of(DType dtype, std::int64_t count, std::uint64_t seed, int r) {
  const auto stream = seed * 1000 + static_cast<std::uint64_t>(r);
  return is_floating(dtype) ? Tensor::random_normal({count}, dtype, stream)
                            : Tensor::random_int({count}, dtype, stream, -100, 100);
}

// The documented result: elements combined in ascending group-rank order.
Tensor expected_reduction(DType dtype, ReduceOp op, std::int64_t count, std::uint64_t seed,
                          int size) {
  std::vector<Tensor> inputs;
  std::vector<const std::byte*> pointers;
  for (int r = 0; r < size; ++r)
    inputs.push_back(input_of(dtype, count, seed, r));
  for (const Tensor& input : inputs)
    pointers.push_back(input.bytes().data());
  Tensor out({count}, dtype);
  std::byte* target = out.bytes().data();
  kernels::reduce_ordered(dtype, op, pointers, std::span<std::byte* const>(&target, 1),
                          static_cast<std::size_t>(count));
  return out;
}

TEST(ThreadsAllReduce, OrderedGivesTheSameBitsOnEveryRankAsTheReference) {
  for (int size : {1, 2, 3, 5, 8}) {
    for (DType dtype : {DType::f32, DType::bf16, DType::f64, DType::i32}) {
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max}) {
        for (std::int64_t count : {0, 1, 7, 5003}) {
          const Tensor expected = expected_reduction(dtype, op, count, 17, size);
          std::atomic<int> matches{0};
          run_threads(size, [&](Communicator& world) {
            Tensor buffer = input_of(dtype, count, 17, world.rank());
            world.all_reduce(buffer, {.op = op});
            if (buffer.bitwise_equal(expected)) ++matches;
          });
          EXPECT_EQ(matches.load(), size) << "size " << size << " " << dtype_name(dtype) << " "
                                          << reduce_op_name(op) << " count " << count;
        }
      }
    }
  }
}

TEST(ThreadsAllReduce, ChunkingAndMessageSizeDoNotChangeBits) {
  const std::int64_t count = 10007;
  const Tensor expected = expected_reduction(DType::f32, ReduceOp::sum, count, 3, 6);
  std::atomic<int> matches{0};
  run_threads(6, [&](Communicator& world) {
    Tensor whole = input_of(DType::f32, count, 3, world.rank());
    // The same data reduced as uneven pieces, queued asynchronously.
    Tensor pieces = whole.clone();
    std::vector<Work> works;
    for (std::int64_t begin = 0, step = 1; begin < count; begin += step, step = step * 3 + 1) {
      works.push_back(
          world.all_reduce_async(pieces.narrow(0, begin, std::min(step, count - begin)), {}));
    }
    world.all_reduce(whole);
    for (const Work& work : works)
      work.wait();
    if (whole.bitwise_equal(expected) && pieces.bitwise_equal(expected)) ++matches;
  });
  EXPECT_EQ(matches.load(), 6);
}

TEST(ThreadsAllReduce, ResultDependsOnGroupPositionsNotPhysicalRanks) {
  // Group {5, 2, 7} of an 8-rank world, ordered by key, gets the same bits as ranks {0, 1, 2}.
  const Tensor expected = expected_reduction(DType::f32, ReduceOp::sum, 999, 8, 3);
  std::atomic<int> matches{0};
  run_threads(8, [&](Communicator& world) {
    const std::int64_t keys[] = {-1, -1, 1, -1, -1, 0, -1, 2};
    const std::int64_t key = keys[world.rank()];
    auto group = world.split(key >= 0 ? 0 : -1, key, {});
    if (!group) return;
    EXPECT_EQ(group->world_ranks(), (std::vector<std::int64_t>{5, 2, 7}));
    Tensor buffer = input_of(DType::f32, 999, 8, group->rank());
    group->all_reduce(buffer);
    if (buffer.bitwise_equal(expected)) ++matches;
  });
  EXPECT_EQ(matches.load(), 3);
}

TEST(ThreadsCollectives, UnevenVariantsWithEmptyRanks) {
  const std::vector<std::int64_t> counts = {3, 0, 5, 1, 0};
  const std::int64_t total = 9;
  std::atomic<int> ok{0};
  run_threads(5, [&](Communicator& world) {
    const int r = world.rank();
    const auto me = static_cast<std::size_t>(r);
    // reduce_scatter: every rank's full input, segment r reduced into an output of counts[r].
    const Tensor full_sum = expected_reduction(DType::f64, ReduceOp::sum, total, 4, 5);
    Tensor rs_out({counts[me]}, DType::f64);
    world.reduce_scatter(input_of(DType::f64, total, 4, r), rs_out, counts);
    const std::int64_t offset = displacements(counts)[me];
    const bool rs_ok = rs_out.bitwise_equal(full_sum.narrow(0, offset, counts[me]));
    // all_gather: rank i contributes counts[i] elements.
    Tensor gathered({total}, DType::i64);
    world.all_gather(input_of(DType::i64, counts[me], 9, r), gathered, counts);
    bool ag_ok = true;
    for (int i = 0; i < 5; ++i) {
      const auto at = static_cast<std::size_t>(i);
      ag_ok = ag_ok && gathered.narrow(0, displacements(counts)[at], counts[at])
                           .bitwise_equal(input_of(DType::i64, counts[at], 9, i));
    }
    // all_to_all: rank i sends (i + j) % 3 elements to rank j.
    std::vector<std::int64_t> send(5), recv(5);
    for (int j = 0; j < 5; ++j) {
      send[static_cast<std::size_t>(j)] = (r + j) % 3;
      recv[static_cast<std::size_t>(j)] = (j + r) % 3;
    }
    const std::int64_t send_total = std::accumulate(send.begin(), send.end(), std::int64_t{0});
    const std::int64_t recv_total = std::accumulate(recv.begin(), recv.end(), std::int64_t{0});
    Tensor received({recv_total}, DType::i32);
    world.all_to_all(input_of(DType::i32, send_total, 2, r), received, send, recv);
    bool a2a_ok = true;
    for (int j = 0; j < 5; ++j) {
      // Segment j came from rank j's input at rank j's send displacement for r.
      std::vector<std::int64_t> their_send(5);
      for (int t = 0; t < 5; ++t)
        their_send[static_cast<std::size_t>(t)] = (j + t) % 3;
      const std::int64_t their_total =
          std::accumulate(their_send.begin(), their_send.end(), std::int64_t{0});
      const Tensor theirs = input_of(DType::i32, their_total, 2, j);
      a2a_ok = a2a_ok &&
               received
                   .narrow(0, displacements(recv)[static_cast<std::size_t>(j)],
                           recv[static_cast<std::size_t>(j)])
                   .bitwise_equal(theirs.narrow(0, displacements(their_send)[me], their_send[me]));
    }
    // broadcast from rank 3.
    Tensor value = r == 3 ? input_of(DType::bf16, 33, 6, 3) : Tensor({33}, DType::bf16);
    world.broadcast(value, 3);
    const bool bc_ok = value.bitwise_equal(input_of(DType::bf16, 33, 6, 3));
    world.barrier();
    if (rs_ok && ag_ok && a2a_ok && bc_ok) ++ok;
  });
  EXPECT_EQ(ok.load(), 5);
}

TEST(ThreadsCollectives, BadArgumentsFailOnTheCallingRankWithTheValue) {
  run_threads(2, [&](Communicator& world) {
    const Tensor input({5}, DType::f32);
    EXPECT_NE(testing::error_message([&] {
                world.reduce_scatter(input, Tensor({2}, DType::f32));
              }).find("5 elements does not split evenly over 2 ranks"),
              std::string::npos);
    EXPECT_NE(testing::error_message([&] {
                world.all_gather(input, Tensor({10}, DType::f64));
              }).find("input is f32 but output is f64"),
              std::string::npos);
    EXPECT_NE(testing::error_message([&] {
                world.reduce_scatter(input, Tensor({2}, DType::f32), {2, 2});
              }).find("add up to 4, but the input holds 5"),
              std::string::npos);
    EXPECT_NE(testing::error_message([&] { world.broadcast(input, 2); }).find("root 2"),
              std::string::npos);
    EXPECT_NE(testing::error_message([&] {
                world.all_reduce(Tensor({4, 4}, DType::f32).narrow(1, 0, 2));
              }).find("strided view"),
              std::string::npos);
    world.barrier();  // nothing above reached the group: it is still in step
  });
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

TEST(ThreadsFailures, AMissingRankTimesOutNamingIt) {
  std::atomic<int> named{0};
  EXPECT_THROW(
      run_threads(3,
                  [&](Communicator& world) {
                    if (world.rank() == 2) return;  // never joins
                    try {
                      world.barrier({.timeout = std::chrono::milliseconds(200)});
                    } catch (const CommError& error) {
                      if (std::string(error.what()).find("world rank(s) [2] never issued it") !=
                          std::string::npos) {
                        ++named;
                      }
                      throw;
                    }
                  }),
      CommError);
  EXPECT_GE(named.load(), 1);
}

TEST(MeshGroups, GroupsFollowMeshOrderAndAreCachedByRankList) {
  const DeviceMesh mesh({2, 3, 1});
  std::atomic<int> ok{0};
  run_threads(6, [&](Communicator& world) {
    std::shared_ptr<Communicator> shared_world(&world, [](Communicator*) {});
    MeshGroups groups(mesh, shared_world);
    const std::vector<std::vector<int>> orders = {{0}, {1}, {0, 1}, {1, 0}, {1, 0, 2}, {}, {2}};
    bool good = true;
    for (const auto& dims : orders) {
      auto group = groups.group(dims);
      good = good && group->world_ranks() == mesh.group_ranks(world.rank(), dims);
      good = good && group->rank() == mesh.group_position(world.rank(), dims);
      // A sum over the group equals the sum of its members' mesh ranks.
      Tensor value = Tensor::full({1}, DType::i64, static_cast<double>(world.rank()));
      group->all_reduce(value);
      std::int64_t expected = 0;
      for (std::int64_t member : mesh.group_ranks(world.rank(), dims))
        expected += member;
      good = good && value.values<std::int64_t>()[0] == expected;
    }
    const std::size_t created = groups.cached_groups();
    const int again[] = {1, 0};
    good = good && groups.group(again).get() == groups.group(std::vector<int>{1, 0, 2}).get();
    good =
        good && groups.cached_groups() == created;  // {1,0,2} has a size-1 dim: same ranks as {1,0}
    // {} and {2} are the rank alone; {0,1} and {1,0} differ in order: distinct groups.
    good = good &&
           groups.group(std::vector<int>{0, 1}).get() != groups.group(std::vector<int>{1, 0}).get();
    if (good) ++ok;
  });
  EXPECT_EQ(ok.load(), 6);
}

}  // namespace
}  // namespace meshtensor::comm
