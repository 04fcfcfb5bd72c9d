// Collective tests that run unchanged on every backend (see harness.hpp): every check is made on
// each rank against a reference any rank can rebuild, so passing on two backends also shows that
// the backends agree bit for bit.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <meshtensor/comm/chain.hpp>
#include <meshtensor/comm/mesh_groups.hpp>
#include <meshtensor/core/error.hpp>
#include <meshtensor/kernels/reduce.hpp>

#include "comm/harness.hpp"
#include "support/error_message.hpp"
#include "support/exact_sum_reference.hpp"
#include "support/spread_values.hpp"

namespace meshtensor::comm {
namespace {

using testing::run_world;

// Input of group rank `r`: depends only on (seed, r), so any rank can rebuild everyone's input.
Tensor input_of(DType dtype, std::int64_t count, std::uint64_t seed, int r) {
  const auto stream = seed * 1000 + static_cast<std::uint64_t>(r);
  return is_floating(dtype) ? Tensor::random_normal({count}, dtype, stream)
                            : Tensor::random_int({count}, dtype, stream, -100, 100);
}

// The documented ordered result: elements combined in ascending group-rank order.
Tensor ordered_reference(const std::vector<Tensor>& inputs, ReduceOp op) {
  std::vector<const std::byte*> pointers;
  for (const Tensor& input : inputs)
    pointers.push_back(input.bytes().data());
  Tensor out(inputs[0].shape(), inputs[0].dtype());
  std::byte* target = out.bytes().data();
  kernels::reduce_ordered(inputs[0].dtype(), op, pointers, std::span<std::byte* const>(&target, 1),
                          static_cast<std::size_t>(inputs[0].numel()));
  return out;
}

Tensor expected_reduction(DType dtype, ReduceOp op, std::int64_t count, std::uint64_t seed,
                          int size) {
  std::vector<Tensor> inputs;
  for (int r = 0; r < size; ++r)
    inputs.push_back(input_of(dtype, count, seed, r));
  return ordered_reference(inputs, op);
}

// Exact reference: the correctly rounded sum (or mean) of every rank's addend.
Tensor exact_reference(const std::vector<Tensor>& addends, ReduceOp op) {
  const DType dtype = addends[0].dtype();
  const int exponent_bits = dtype == DType::f64 ? 11 : dtype == DType::f16 ? 5 : 8;
  const int mantissa_bits = dtype == DType::f64   ? 52
                            : dtype == DType::f32 ? 23
                            : dtype == DType::f16 ? 10
                                                  : 7;
  Tensor out(addends[0].shape(), dtype);
  const std::size_t element = dtype_size(dtype);
  for (std::int64_t i = 0; i < out.numel(); ++i) {
    testing::ExactSumReference sum;
    const std::int64_t at[] = {i};
    for (const Tensor& addend : addends)
      sum.add(addend.get(at));
    const std::uint64_t bits =
        sum.rounded(exponent_bits, mantissa_bits,
                    op == ReduceOp::avg ? static_cast<std::uint64_t>(addends.size()) : 1);
    std::memcpy(out.bytes().data() + static_cast<std::size_t>(i) * element, &bits, element);
  }
  return out;
}

TEST(AllReduce, OrderedGivesTheSameBitsOnEveryRankAsTheReference) {
  for (int size : {1, 2, 3, 5, 8}) {
    for (DType dtype : {DType::f32, DType::bf16, DType::f64, DType::f16, DType::i32}) {
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min}) {
        for (std::int64_t count : {0, 1, 7, 5003}) {
          const Tensor expected = expected_reduction(dtype, op, count, 17, size);
          run_world(size, [&](Communicator& world) {
            Tensor buffer = input_of(dtype, count, 17, world.rank());
            world.all_reduce(buffer, {.op = op});
            EXPECT_TRUE(buffer.bitwise_equal(expected))
                << "rank " << world.rank() << " of " << size << " " << dtype_name(dtype) << " "
                << reduce_op_name(op) << " count " << count;
          });
        }
      }
    }
  }
}

TEST(AllReduce, NativeModeAgreesWithOrderedWithinRounding) {
  // native promises no bits, only the value: integers exactly, floats to within rounding.
  for (DType dtype : {DType::f32, DType::f64, DType::bf16, DType::i64}) {
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max}) {
      const Tensor expected = expected_reduction(dtype, op, 3001, 41, 5);
      run_world(5, [&](Communicator& world) {
        Tensor buffer = input_of(dtype, 3001, 41, world.rank());
        world.all_reduce(buffer, {.op = op, .mode = ReductionMode::native});
        const double tolerance = dtype == DType::bf16 ? 0.05 : is_floating(dtype) ? 1e-5 : 0.0;
        for (std::int64_t i = 0; i < 3001; ++i) {
          const std::int64_t at[] = {i};
          ASSERT_NEAR(buffer.get(at), expected.get(at), tolerance)
              << dtype_name(dtype) << " " << reduce_op_name(op) << " element " << i;
        }
      });
    }
  }
}

TEST(AllReduce, ChunkingAndMessageSizeDoNotChangeBits) {
  const std::int64_t count = 10007;
  const Tensor expected = expected_reduction(DType::f32, ReduceOp::sum, count, 3, 6);
  run_world(6, [&](Communicator& world) {
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
    EXPECT_TRUE(whole.bitwise_equal(expected)) << "rank " << world.rank();
    EXPECT_TRUE(pieces.bitwise_equal(expected)) << "rank " << world.rank();
  });
}

TEST(AllReduce, ResultDependsOnGroupPositionsNotPhysicalRanks) {
  // Group {5, 2, 7} of an 8-rank world, ordered by key, gets the same bits as ranks {0, 1, 2}.
  const Tensor expected = expected_reduction(DType::f32, ReduceOp::sum, 999, 8, 3);
  run_world(8, [&](Communicator& world) {
    const std::int64_t keys[] = {-1, -1, 1, -1, -1, 0, -1, 2};
    const std::int64_t key = keys[world.rank()];
    auto group = world.split(key >= 0 ? 0 : -1, key, {});
    if (!group) return;
    EXPECT_EQ(group->world_ranks(), (std::vector<std::int64_t>{5, 2, 7}));
    Tensor buffer = input_of(DType::f32, 999, 8, group->rank());
    group->all_reduce(buffer);
    EXPECT_TRUE(buffer.bitwise_equal(expected)) << "world rank " << world.rank();
  });
}

TEST(Collectives, UnevenVariantsWithEmptyRanks) {
  const std::vector<std::int64_t> counts = {3, 0, 5, 1, 0};
  const std::int64_t total = 9;
  const Tensor full_sum = expected_reduction(DType::f64, ReduceOp::sum, total, 4, 5);
  run_world(5, [&](Communicator& world) {
    const int r = world.rank();
    const auto me = static_cast<std::size_t>(r);
    // reduce_scatter: every rank's full input, segment r reduced into an output of counts[r].
    Tensor rs_out({counts[me]}, DType::f64);
    world.reduce_scatter(input_of(DType::f64, total, 4, r), rs_out, counts);
    const std::int64_t offset = displacements(counts)[me];
    EXPECT_TRUE(rs_out.bitwise_equal(full_sum.narrow(0, offset, counts[me]))) << "rank " << r;
    // all_gather: rank i contributes counts[i] elements.
    Tensor gathered({total}, DType::i64);
    world.all_gather(input_of(DType::i64, counts[me], 9, r), gathered, counts);
    for (int i = 0; i < 5; ++i) {
      const auto at = static_cast<std::size_t>(i);
      EXPECT_TRUE(gathered.narrow(0, displacements(counts)[at], counts[at])
                      .bitwise_equal(input_of(DType::i64, counts[at], 9, i)))
          << "rank " << r << " segment " << i;
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
    for (int j = 0; j < 5; ++j) {
      // Segment j came from rank j's input at rank j's send displacement for r.
      std::vector<std::int64_t> their_send(5);
      for (int t = 0; t < 5; ++t)
        their_send[static_cast<std::size_t>(t)] = (j + t) % 3;
      const std::int64_t their_total =
          std::accumulate(their_send.begin(), their_send.end(), std::int64_t{0});
      const Tensor theirs = input_of(DType::i32, their_total, 2, j);
      EXPECT_TRUE(
          received
              .narrow(0, displacements(recv)[static_cast<std::size_t>(j)],
                      recv[static_cast<std::size_t>(j)])
              .bitwise_equal(theirs.narrow(0, displacements(their_send)[me], their_send[me])))
          << "rank " << r << " from " << j;
    }
    // Equal all_to_all and all_gather.
    Tensor a2a_out({10}, DType::f32);
    world.all_to_all(input_of(DType::f32, 10, 12, r), a2a_out);
    for (int j = 0; j < 5; ++j) {
      EXPECT_TRUE(a2a_out.narrow(0, 2 * j, 2)
                      .bitwise_equal(input_of(DType::f32, 10, 12, j).narrow(0, 2 * r, 2)));
    }
    // broadcast from rank 3.
    Tensor value = r == 3 ? input_of(DType::bf16, 33, 6, 3) : Tensor({33}, DType::bf16);
    world.broadcast(value, 3);
    EXPECT_TRUE(value.bitwise_equal(input_of(DType::bf16, 33, 6, 3))) << "rank " << r;
    world.barrier();
  });
}

TEST(Collectives, BadArgumentsFailOnTheCallingRankWithTheValue) {
  run_world(2, [&](Communicator& world) {
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

TEST(MeshGroups, GroupsFollowMeshOrderAndAreCachedByRankList) {
  const DeviceMesh mesh({2, 3, 1});
  run_world(6, [&](Communicator& world) {
    std::shared_ptr<Communicator> shared_world(&world, [](Communicator*) {});
    MeshGroups groups(mesh, shared_world);
    const std::vector<std::vector<int>> orders = {{0}, {1}, {0, 1}, {1, 0}, {1, 0, 2}, {}, {2}};
    for (const auto& dims : orders) {
      auto group = groups.group(dims);
      EXPECT_EQ(group->world_ranks(), mesh.group_ranks(world.rank(), dims));
      EXPECT_EQ(group->rank(), mesh.group_position(world.rank(), dims));
      // A sum over the group equals the sum of its members' mesh ranks.
      Tensor value = Tensor::full({1}, DType::i64, static_cast<double>(world.rank()));
      group->all_reduce(value);
      std::int64_t expected = 0;
      for (std::int64_t member : mesh.group_ranks(world.rank(), dims))
        expected += member;
      EXPECT_EQ(value.values<std::int64_t>()[0], expected);
    }
    const std::size_t created = groups.cached_groups();
    const int again[] = {1, 0};
    // {1,0,2} has a size-1 dim: the same ranks as {1,0}, so the same communicator.
    EXPECT_EQ(groups.group(again).get(), groups.group(std::vector<int>{1, 0, 2}).get());
    EXPECT_EQ(groups.cached_groups(), created);
    // {0,1} and {1,0} differ in order: distinct groups.
    EXPECT_NE(groups.group(std::vector<int>{0, 1}).get(),
              groups.group(std::vector<int>{1, 0}).get());
  });
}

// ---- exact mode ----

// Every order of the dims of a mesh.
std::vector<std::vector<int>> permutations(int dims) {
  std::vector<int> order(static_cast<std::size_t>(dims));
  std::iota(order.begin(), order.end(), 0);
  std::vector<std::vector<int>> all;
  do {
    all.push_back(order);
  } while (std::next_permutation(order.begin(), order.end()));
  return all;
}

// Runs an exact all_reduce of each rank's `addends[rank]` over 8 ranks as one flattened
// collective, as one flattened collective over the ranks in every mesh-dim order, and as a chain
// of per-dim all_reduces over 2x4, 4x2 and 2x2x2 meshes in every dim order; every result must
// carry the same bits as `reference` or, when it is undefined, as the flattened result, which
// must then be the same on every rank.
void expect_every_grouping_gives(const std::vector<Tensor>& addends, ReduceOp op,
                                 const Tensor& reference) {
  const CollectiveOptions exact{.op = op, .mode = ReductionMode::exact};
  run_world(8, [&](Communicator& world) {
    const int r = world.rank();
    Tensor flat = addends[static_cast<std::size_t>(r)].clone();
    world.all_reduce(flat, exact);
    const Tensor expected = reference.defined() ? reference : flat;
    EXPECT_TRUE(flat.bitwise_equal(expected)) << "flattened, rank " << r;
    // Every rank holds the same bits: compare digests.
    Tensor digests({8}, DType::i64);
    Tensor mine({1}, DType::i64);
    mine.values<std::int64_t>()[0] = static_cast<std::int64_t>(flat.digest());
    world.all_gather(mine, digests);
    for (std::int64_t d : digests.values<std::int64_t>())
      EXPECT_EQ(d, mine.values<std::int64_t>()[0]) << "rank " << r;
    std::shared_ptr<Communicator> shared_world(&world, [](Communicator*) {});
    for (const std::vector<std::int64_t>& sizes :
         std::vector<std::vector<std::int64_t>>{{2, 4}, {4, 2}, {2, 2, 2}}) {
      MeshGroups groups(DeviceMesh(sizes), shared_world);
      for (const std::vector<int>& order : permutations(static_cast<int>(sizes.size()))) {
        // One collective over all dims in this major-to-minor order.
        Tensor one = addends[static_cast<std::size_t>(r)].clone();
        groups.group(order)->all_reduce(one, exact);
        EXPECT_TRUE(one.bitwise_equal(expected)) << "flattened in dim order, rank " << r;
        // A chain of single-dim steps in this order.
        std::vector<Communicator*> chain;
        for (int dim : order)
          chain.push_back(groups.group(std::vector<int>{dim}).get());
        Tensor stepped = addends[static_cast<std::size_t>(r)].clone();
        all_reduce_chain(chain, stepped, exact);
        EXPECT_TRUE(stepped.bitwise_equal(expected))
            << "chain on mesh of " << sizes.size() << " dims, rank " << r;
      }
    }
  });
}

std::vector<Tensor> rank_addends(DType dtype, std::int64_t count, int low_base, int high_base,
                                 int spread, std::uint64_t seed) {
  std::vector<Tensor> addends;
  for (int r = 0; r < 8; ++r)
    addends.push_back(testing::spread_values(dtype, count, low_base, high_base, spread, seed, r));
  return addends;
}

TEST(ExactAllReduce, EveryGroupingGivesTheCorrectlyRoundedSum) {
  // Addends within the exact range of each dtype: the result is the correctly rounded sum.
  struct Case {
    DType dtype;
    int low_base, high_base, spread;
  };
  for (const Case& c : {Case{DType::f32, -120, 100, 24}, Case{DType::f64, -900, 900, 36},
                        Case{DType::bf16, -110, 80, 40}, Case{DType::f16, -24, -16, 30}}) {
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg}) {
      const std::vector<Tensor> addends =
          rank_addends(c.dtype, 777, c.low_base, c.high_base, c.spread, 21);
      SCOPED_TRACE(std::string(dtype_name(c.dtype)) + " " + std::string(reduce_op_name(op)));
      expect_every_grouping_gives(addends, op, exact_reference(addends, op));
    }
  }
}

TEST(ExactAllReduce, WideRangesGiveTheSameBitsForEveryGroupingWhereOrderedDoesNot) {
  // 70 binades between addends of one element: beyond the exact range, the floor applies, yet
  // every grouping still agrees. The ordered mode, for contrast, changes with the rank order.
  const std::vector<Tensor> addends = rank_addends(DType::f32, 4000, -40, 40, 70, 8);
  expect_every_grouping_gives(addends, ReduceOp::sum, Tensor());

  std::vector<Tensor> reversed(addends.rbegin(), addends.rend());
  EXPECT_FALSE(ordered_reference(addends, ReduceOp::sum)
                   .bitwise_equal(ordered_reference(reversed, ReduceOp::sum)))
      << "the data is meant to make rank order matter for ordered sums";
}

TEST(ExactReduceScatter, UnevenCountsWithEmptyRanksMatchTheReference) {
  const std::vector<std::int64_t> counts = {4, 0, 7, 1, 0, 3};
  const std::int64_t total = 15;
  for (DType dtype : {DType::f32, DType::f64, DType::bf16}) {
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg}) {
      std::vector<Tensor> addends;
      for (int r = 0; r < 6; ++r)
        addends.push_back(testing::spread_values(dtype, total, -20, 20, 20, 3, r));
      const Tensor expected = exact_reference(addends, op);
      run_world(6, [&](Communicator& world) {
        const auto me = static_cast<std::size_t>(world.rank());
        Tensor out({counts[me]}, dtype);
        world.reduce_scatter(addends[me], out, counts, {.op = op, .mode = ReductionMode::exact});
        EXPECT_TRUE(out.bitwise_equal(expected.narrow(0, displacements(counts)[me], counts[me])))
            << dtype_name(dtype) << " " << reduce_op_name(op) << " rank " << me;
      });
    }
  }
}

TEST(ExactAllReduce, TopOfTheDoubleRangeKeepsTheFloorOnEveryGrouping) {
  // 2^1009 and -2^1009 cancel; 2^973 (1 + 2^-52), 36 binades below them, must survive whole.
  std::vector<Tensor> addends;
  const double values[] = {std::ldexp(1.0, 1009), -std::ldexp(1.0, 1009),
                           std::ldexp(1.0 + 0x1p-52, 973)};
  for (int r = 0; r < 8; ++r) {
    addends.push_back(
        Tensor::from_values({2}, DType::f64, std::vector<double>{r < 3 ? values[r] : 0.0, 1.0}));
  }
  const Tensor reference = exact_reference(addends, ReduceOp::sum);
  ASSERT_EQ(reference.values<double>()[0], values[2]);
  expect_every_grouping_gives(addends, ReduceOp::sum, reference);
  run_world(3, [&](Communicator& world) {
    Tensor buffer = addends[static_cast<std::size_t>(world.rank())].clone();
    world.all_reduce(buffer, {.mode = ReductionMode::exact});
    EXPECT_EQ(std::bit_cast<std::uint64_t>(buffer.values<double>()[0]),
              std::bit_cast<std::uint64_t>(values[2]));
  });
}

TEST(ExactAllReduce, ChainsWithMoreAddendsThanAnInt64CountsAreRefused) {
  // 64 steps over a group of 2 would be 2^64 addends: refused, never wrapped to 0.
  run_world(2, [&](Communicator& world) {
    for (const int steps : {16, 62, 63, 64, 200}) {
      std::vector<Communicator*> chain(static_cast<std::size_t>(steps), &world);
      for (const ReduceOp op : {ReduceOp::sum, ReduceOp::avg}) {
        Tensor buffer = Tensor::full({3}, DType::f32, 1.0);
        const std::string message = testing::error_message(
            [&] { all_reduce_chain(chain, buffer, {.op = op, .mode = ReductionMode::exact}); });
        // The chain's length, the limit, how far the count got and the sizes that got it there.
        EXPECT_NE(message.find(fmt::format("over {} groups has more addends per element than the "
                                           "limit of 32768: the first 16 (sizes [2,2,2,2,2,2,2,"
                                           "2,2,2,2,2,2,2,2,2]) already give 65536",
                                           steps)),
                  std::string::npos)
            << steps << " steps: " << message;
        EXPECT_EQ(buffer.values<float>()[0], 1.0f) << "the buffer is left as it was";
      }
    }
  });
}

// NaN addends with different signs and payloads: every path (whole buffer, pieces, fused with
// other data, reduce_scatter) gives the canonical NaN, so the bits never depend on chunking.
TEST(AllReduce, NanSumsAreCanonicalOnEveryPath) {
  for (const DType dtype : {DType::f32, DType::f64, DType::bf16}) {
    const Tensor canonical = Tensor::full({1}, dtype, std::numeric_limits<double>::quiet_NaN());
    const std::uint64_t nans_f32[] = {0x7FC00001u, 0xFFC00002u};
    const std::uint64_t nans_f64[] = {0x7FF8000000000001ull, 0xFFF8000000000002ull};
    const std::uint64_t nans_bf16[] = {0x7FC1u, 0xFFC2u};
    const std::uint64_t* nans = dtype == DType::f32   ? nans_f32
                                : dtype == DType::f64 ? nans_f64
                                                      : nans_bf16;
    for (const ReductionMode mode : {ReductionMode::ordered, ReductionMode::exact}) {
      for (const ReduceOp op : {ReduceOp::sum, ReduceOp::avg}) {
        run_world(2, [&](Communicator& world) {
          const std::size_t element = dtype_size(dtype);
          const CollectiveOptions options{.op = op, .mode = mode};
          for (const std::int64_t count : {1, 2, 8, 9, 1001}) {
            Tensor buffer = input_of(dtype, count, 7, world.rank());
            const std::int64_t at = count - 1;
            std::memcpy(buffer.bytes().data() + static_cast<std::size_t>(at) * element,
                        &nans[world.rank()], element);
            Tensor pieces = buffer.clone();
            const std::vector<std::int64_t> counts = balanced_counts(count, 2);
            Tensor scattered({counts[static_cast<std::size_t>(world.rank())]}, dtype);
            world.reduce_scatter(buffer, scattered, counts, options);
            world.all_reduce(buffer, options);
            EXPECT_TRUE(buffer.narrow(0, at, 1).bitwise_equal(canonical))
                << dtype_name(dtype) << " count " << count;
            // The same element reduced as a piece of its own.
            Tensor piece = pieces.narrow(0, at, 1).contiguous();
            world.all_reduce(piece, options);
            EXPECT_TRUE(piece.bitwise_equal(canonical)) << dtype_name(dtype) << " piece";
            if (world.rank() == (count > 1 ? 1 : 0)) {  // the rank holding the last element
              EXPECT_TRUE(scattered.narrow(0, scattered.numel() - 1, 1).bitwise_equal(canonical))
                  << dtype_name(dtype) << " reduce_scatter, count " << count;
            }
          }
          // Alone, as a one-element buffer.
          Tensor one({1}, dtype);
          std::memcpy(one.bytes().data(), &nans[world.rank()], element);
          world.all_reduce(one, options);
          EXPECT_TRUE(one.bitwise_equal(canonical)) << dtype_name(dtype) << " alone";
        });
      }
    }
  }
}

TEST(ExactAllReduce, MaxMinAndIntegersAreExactAlreadyAndMatchOrdered) {
  for (DType dtype : {DType::f32, DType::i64}) {
    for (ReduceOp op : {ReduceOp::max, ReduceOp::min, ReduceOp::sum}) {
      const Tensor expected = expected_reduction(dtype, op, 301, 5, 4);
      if (is_floating(dtype) && op == ReduceOp::sum) continue;
      run_world(4, [&](Communicator& world) {
        Tensor buffer = input_of(dtype, 301, 5, world.rank());
        world.all_reduce(buffer, {.op = op, .mode = ReductionMode::exact});
        EXPECT_TRUE(buffer.bitwise_equal(expected))
            << dtype_name(dtype) << " " << reduce_op_name(op) << " rank " << world.rank();
      });
    }
  }
}

}  // namespace
}  // namespace meshtensor::comm
