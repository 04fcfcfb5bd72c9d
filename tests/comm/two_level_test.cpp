// Collectives in two levels (inside hosts, then across) on a threads world with a topology: the
// documented order in ordered mode, the flat collective's bits in exact mode, any counts.
#include <map>
#include <memory>
#include <vector>

#include <gtest/gtest.h>

#include <meshtensor/comm/mesh_groups.hpp>
#include <meshtensor/comm/threads_backend.hpp>
#include <meshtensor/comm/two_level.hpp>
#include <meshtensor/kernels/reduce.hpp>
#include <meshtensor/mesh/device_mesh.hpp>

namespace meshtensor::comm {
namespace {

constexpr int kRanks = 12;  // 3 hosts of 4

Topology three_hosts() {
  return Topology::from_host_sizes(kRanks, {4});
}

Tensor input_of(int rank, std::int64_t count, std::uint64_t salt = 0) {
  return Tensor::random_normal({count}, DType::f32, 3600 + salt + static_cast<std::uint64_t>(rank));
}

// Element-wise ordered sum of `parts` (the kernel the ordered collectives use).
Tensor ordered_sum(const std::vector<Tensor>& parts) {
  std::vector<const std::byte*> pointers;
  for (const Tensor& part : parts)
    pointers.push_back(part.bytes().data());
  Tensor out(parts.front().shape(), DType::f32);
  std::byte* target = out.bytes().data();
  kernels::reduce_ordered(DType::f32, ReduceOp::sum, pointers,
                          std::span<std::byte* const>(&target, 1),
                          static_cast<std::size_t>(parts.front().numel()));
  return out;
}

// Sum inside each host of 4 in rank order, then the hosts' sums in host order.
Tensor two_level_sum(const std::vector<Tensor>& inputs) {
  std::vector<Tensor> hosts;
  for (int h = 0; h < kRanks / 4; ++h) {
    hosts.push_back(
        ordered_sum(std::vector<Tensor>(inputs.begin() + 4 * h, inputs.begin() + 4 * h + 4)));
  }
  return ordered_sum(hosts);
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.numel() == b.numel() && a.digest() == b.digest();
}

void on_three_hosts(
    const std::function<void(MeshGroups&, Communicator& two, Communicator& flat)>& body) {
  run_threads(
      kRanks,
      [&](Communicator& world) {
        const std::shared_ptr<Communicator> shared(&world, [](Communicator*) {});
        MeshGroups groups(DeviceMesh(std::vector<std::int64_t>{kRanks}), shared);
        const std::vector<int> dims = {0};
        const auto two = groups.two_level_group(dims, TwoLevelChoice::always);
        ASSERT_NE(dynamic_cast<TwoLevelCommunicator*>(two.get()), nullptr);
        body(groups, *two, *groups.group(dims));
      },
      SimulatedNetwork({}, three_hosts()));
}

TEST(TwoLevel, OrderedAllReduceSumsInsideHostsThenAcross) {
  constexpr std::int64_t kCount = 1001;  // not a multiple of 4
  std::vector<Tensor> inputs;
  for (int r = 0; r < kRanks; ++r)
    inputs.push_back(input_of(r, kCount));
  const Tensor expected = two_level_sum(inputs);
  std::atomic<int> good{0};
  on_three_hosts([&](MeshGroups&, Communicator& two, Communicator&) {
    Tensor buffer = inputs[static_cast<std::size_t>(two.rank())].clone();
    two.all_reduce(buffer);
    if (same_bits(buffer, expected)) ++good;
  });
  EXPECT_EQ(good.load(), kRanks);
}

TEST(TwoLevel, ExactModeGivesTheFlatCollectivesBits) {
  constexpr std::int64_t kCount = 777;
  std::atomic<int> good{0};
  on_three_hosts([&](MeshGroups&, Communicator& two, Communicator& flat) {
    CollectiveOptions exact;
    exact.mode = ReductionMode::exact;
    for (const ReduceOp op : {ReduceOp::sum, ReduceOp::avg}) {
      exact.op = op;
      Tensor a = input_of(two.rank(), kCount, 1);
      Tensor b = a.clone();
      two.all_reduce(a, exact);
      flat.all_reduce(b, exact);
      // reduce_scatter with uneven segments, one of them empty.
      std::vector<std::int64_t> counts;
      for (int r = 0; r < kRanks; ++r)
        counts.push_back(r == 5 ? 0 : r + 3);
      std::int64_t total = 0;
      for (const std::int64_t c : counts)
        total += c;
      const Tensor input = input_of(two.rank(), total, 2);
      Tensor mine_two({counts[static_cast<std::size_t>(two.rank())]}, DType::f32);
      Tensor mine_flat = mine_two.clone();
      two.reduce_scatter(input, mine_two, counts, exact);
      flat.reduce_scatter(input, mine_flat, counts, exact);
      if (same_bits(a, b) && same_bits(mine_two, mine_flat)) ++good;
    }
  });
  EXPECT_EQ(good.load(), 2 * kRanks);
}

TEST(TwoLevel, ReduceScatterAndAllGatherKeepEveryMembersSegment) {
  std::vector<std::int64_t> counts;
  std::int64_t total = 0;
  for (int r = 0; r < kRanks; ++r) {
    counts.push_back((r * 7) % 5);
    total += counts.back();
  }
  std::vector<Tensor> inputs;
  for (int r = 0; r < kRanks; ++r)
    inputs.push_back(input_of(r, total, 3));
  const Tensor summed = two_level_sum(inputs);
  std::atomic<int> good{0};
  on_three_hosts([&](MeshGroups&, Communicator& two, Communicator& flat) {
    const auto me = static_cast<std::size_t>(two.rank());
    std::int64_t first = 0;
    for (std::size_t p = 0; p < me; ++p)
      first += counts[p];
    Tensor mine({counts[me]}, DType::f32);
    two.reduce_scatter(inputs[me], mine, counts);
    bool ok = same_bits(mine, summed.narrow(0, first, counts[me]).clone());
    // Gathers: the same bytes as the flat all_gather, asynchronously too.
    Tensor gathered({total}, DType::f32);
    Tensor reference({total}, DType::f32);
    Work work = two.all_gather_async(mine, gathered, counts, {});
    flat.all_gather(mine, reference, counts);
    work.wait();
    ok = ok && same_bits(gathered, reference) && same_bits(gathered, summed);
    // max needs no order: the flat result.
    CollectiveOptions max;
    max.op = ReduceOp::max;
    Tensor a = inputs[me].clone();
    Tensor b = inputs[me].clone();
    two.all_reduce(a, max);
    flat.all_reduce(b, max);
    if (ok && same_bits(a, b)) ++good;
  });
  EXPECT_EQ(good.load(), kRanks);
}

TEST(TwoLevel, JaggedGroupsRunInTwoLevelsAndGroupsAreCached) {
  // Mesh 4x3 on hosts of 4: groups along dim 1 (3 consecutive ranks) straddle hosts unevenly.
  std::atomic<int> good{0};
  run_threads(
      kRanks,
      [&](Communicator& world) {
        const std::shared_ptr<Communicator> shared(&world, [](Communicator*) {});
        MeshGroups groups(DeviceMesh(std::vector<std::int64_t>{4, 3}), shared);
        const std::vector<int> row = {1};
        const std::vector<int> all = {0, 1};
        const auto jagged = groups.two_level_group(row, TwoLevelChoice::always);
        const auto whole = groups.two_level_group(all, TwoLevelChoice::always);
        // Rows 0 and 3 sit on one host; rows 1 (3 | 4,5) and 2 (6,7 | 8) on two, unevenly.
        const auto* row_two = dynamic_cast<TwoLevelCommunicator*>(jagged.get());
        const std::int64_t row_index = world.rank() / 3;
        const bool row_ok =
            (row_index == 0 || row_index == 3)
                ? row_two == nullptr
                : row_two != nullptr && row_two->units() == 2 && row_two->per_unit() == 0;
        const auto* two = dynamic_cast<TwoLevelCommunicator*>(whole.get());
        const bool cached = groups.two_level_group(all, TwoLevelChoice::always) == whole;
        Tensor ones = Tensor::full({5}, DType::f32, 1.0);
        whole->all_reduce(ones);
        Tensor row_ones = Tensor::full({2}, DType::f32, 1.0);
        jagged->all_reduce(row_ones);
        if (row_ok && two != nullptr && two->units() == 3 && two->per_unit() == 4 && cached &&
            ones.values<float>()[4] == 12.0F && row_ones.values<float>()[1] == 3.0F)
          ++good;
      },
      SimulatedNetwork({}, three_hosts()));
  EXPECT_EQ(good.load(), kRanks);
}

// Seed 000 scaled down: (ddp=4, fsdp=5) on hosts of 8. fsdp groups {5..9} sit 3 + 2 and
// {15..19} 1 + 4 on two hosts; ddp groups (stride 5) sit 2 + 2 or 2 + 1 + 1 (or 1 + 2 + 1 ...).
constexpr int kSeedRanks = 20;

Topology seed_hosts() {
  return Topology::from_host_sizes(kSeedRanks, {8});
}

// The documented order for `members` (world ranks, group order): each element summed inside
// each host in group order, then the hosts' sums in host order.
Tensor hosts_then_across(const std::vector<Tensor>& inputs,
                         const std::vector<std::int64_t>& members, const Topology& topology) {
  std::map<int, std::vector<Tensor>> by_host;
  for (const std::int64_t r : members)
    by_host[topology.host(r)].push_back(inputs[static_cast<std::size_t>(r)]);
  std::vector<Tensor> sums;
  for (const auto& [host, parts] : by_host)
    sums.push_back(ordered_sum(parts));
  return ordered_sum(sums);
}

// Runs `body` on every rank with the two-level and flat groups along `dims` of `mesh` on
// `topology`.
void on_mesh(
    const DeviceMesh& mesh, const Topology& topology, const std::vector<int>& dims,
    const std::function<void(const DeviceMesh&, Communicator& two, Communicator& flat)>& body) {
  run_threads(
      static_cast<int>(mesh.size()),
      [&](Communicator& world) {
        const std::shared_ptr<Communicator> shared(&world, [](Communicator*) {});
        MeshGroups groups(mesh, shared);
        const auto two = groups.two_level_group(dims, TwoLevelChoice::always);
        body(mesh, *two, *groups.group(dims));
      },
      SimulatedNetwork({}, topology));
}

void on_seed_mesh(
    const std::vector<int>& dims,
    const std::function<void(const DeviceMesh&, Communicator& two, Communicator& flat)>& body) {
  on_mesh(DeviceMesh(std::vector<std::int64_t>{4, 5}), seed_hosts(), dims, body);
}

// Ordered all_reduce and reduce_scatter (uneven segments, one empty) of `inputs` (by world
// rank) along `dims`: counts the ranks whose results are `expected_of(members)`'s bits.
int ordered_results_equal(const DeviceMesh& mesh, const Topology& topology,
                          const std::vector<int>& dims, const std::vector<Tensor>& inputs,
                          const std::function<Tensor(const std::vector<std::int64_t>&,
                                                     Communicator& flat)>& expected_of) {
  const std::int64_t count = inputs.front().numel();
  std::atomic<int> good{0};
  on_mesh(mesh, topology, dims, [&](const DeviceMesh&, Communicator& two, Communicator& flat) {
    const std::vector<std::int64_t>& members = two.world_ranks();
    const Tensor expected = expected_of(members, flat);
    const auto me = static_cast<std::size_t>(members[static_cast<std::size_t>(two.rank())]);
    Tensor buffer = inputs[me].clone();
    two.all_reduce(buffer);
    std::vector<std::int64_t> counts;
    for (int p = 0; p < two.size(); ++p)
      counts.push_back(p == 1 ? 0 : (p == 2 ? count - 10 * (two.size() - 2) : 10));
    const std::int64_t first = displacements(counts)[static_cast<std::size_t>(two.rank())];
    Tensor mine({counts[static_cast<std::size_t>(two.rank())]}, DType::f32);
    two.reduce_scatter(inputs[me], mine, counts);
    if (same_bits(buffer, expected) &&
        same_bits(mine, expected.narrow(0, first, mine.numel()).clone()))
      ++good;
  });
  return good.load();
}

TEST(TwoLevel, JaggedOrderedSumsInsideHostsThenAcross) {
  // Mesh 5x2 on hosts of 6 (6 + 4 ranks): both groups along dim 0 sit 3 + 2, alike.
  const DeviceMesh mesh(std::vector<std::int64_t>{5, 2});
  const Topology topology = Topology::from_host_sizes(10, {6});
  std::vector<Tensor> inputs;
  for (int r = 0; r < 10; ++r)
    inputs.push_back(input_of(r, 203, 7));
  EXPECT_EQ(ordered_results_equal(mesh, topology, {0}, inputs,
                                  [&](const std::vector<std::int64_t>& members, Communicator&) {
                                    return hosts_then_across(inputs, members, topology);
                                  }),
            10);
}

TEST(TwoLevel, OrderedSumsRunFlatWhenGroupsSplitDifferently) {
  // Seed 000's fsdp groups sit 5, 3 + 2, 5, 1 + 4 on hosts of 8: in two levels each would add
  // in its own order, and what they replicate would differ. The flat ordered bits instead.
  std::vector<Tensor> inputs;
  for (int r = 0; r < kSeedRanks; ++r)
    inputs.push_back(input_of(r, 203, 8));
  for (const std::vector<int>& dims : {std::vector<int>{1}, std::vector<int>{0}}) {
    EXPECT_EQ(ordered_results_equal(DeviceMesh(std::vector<std::int64_t>{4, 5}), seed_hosts(), dims,
                                    inputs,
                                    [&](const std::vector<std::int64_t>& members, Communicator&) {
                                      std::vector<Tensor> parts;
                                      for (const std::int64_t r : members)
                                        parts.push_back(inputs[static_cast<std::size_t>(r)]);
                                      return ordered_sum(parts);
                                    }),
              kSeedRanks)
        << "dims " << dims.front();
  }
}

TEST(TwoLevel, JaggedExactGivesTheFlatBitsAndGathersKeepEverySegment) {
  for (const std::vector<int>& dims : {std::vector<int>{1}, std::vector<int>{0}}) {
    std::atomic<int> good{0};
    on_seed_mesh(dims, [&](const DeviceMesh&, Communicator& two, Communicator& flat) {
      const auto salt =
          static_cast<std::uint64_t>(two.world_ranks()[static_cast<std::size_t>(two.rank())]);
      bool ok = true;
      CollectiveOptions exact;
      exact.mode = ReductionMode::exact;
      for (const ReduceOp op : {ReduceOp::sum, ReduceOp::avg}) {
        exact.op = op;
        Tensor a = input_of(static_cast<int>(salt), 333, 11);
        Tensor b = a.clone();
        two.all_reduce(a, exact);
        flat.all_reduce(b, exact);
        std::vector<std::int64_t> counts;
        for (int p = 0; p < two.size(); ++p)
          counts.push_back(p == 0 ? 0 : 7 * p + 1);
        std::int64_t total = 0;
        for (const std::int64_t c : counts)
          total += c;
        const Tensor input = input_of(static_cast<int>(salt), total, 12);
        Tensor mine_two({counts[static_cast<std::size_t>(two.rank())]}, DType::f32);
        Tensor mine_flat = mine_two.clone();
        two.reduce_scatter(input, mine_two, counts, exact);
        flat.reduce_scatter(input, mine_flat, counts, exact);
        // The gathers: the same bytes as the flat all_gather, asynchronously too.
        Tensor gathered({total}, DType::f32);
        Tensor reference({total}, DType::f32);
        Work work = two.all_gather_async(mine_two, gathered, counts, {});
        flat.all_gather(mine_flat, reference, counts);
        work.wait();
        ok = ok && same_bits(a, b) && same_bits(mine_two, mine_flat) &&
             same_bits(gathered, reference);
      }
      CollectiveOptions max;
      max.op = ReduceOp::max;
      Tensor a = input_of(static_cast<int>(salt), 50, 13);
      Tensor b = a.clone();
      two.all_reduce(a, max);
      flat.all_reduce(b, max);
      if (ok && same_bits(a, b)) ++good;
    });
    EXPECT_EQ(good.load(), kSeedRanks) << "dims " << dims.front();
  }
}

TEST(TwoLevel, SimulatedLinkChargesTheLevelCrossed) {
  const Topology topology = Topology::from_host_sizes(
      8, {4}, 0, {LinkFigures{1e-6, 1e9}, LinkFigures{2e-6, 1e9}, LinkFigures{1e-3, 1e9}});
  const LinkDelay link = simulated_topology_link(topology);
  CollectiveCall call;
  call.kind = CollectiveKind::barrier;
  EXPECT_EQ(link(call, {0, 1, 2}), std::chrono::nanoseconds(1000));
  EXPECT_EQ(link(call, {3, 4}), std::chrono::nanoseconds(1000000));
  // An exchange is charged on its larger direction: a relay sends more than it receives.
  call.kind = CollectiveKind::all_to_all;
  call.dtype = DType::f32;
  call.send_counts = {0, 300, 300};
  call.recv_counts = {0, 30, 0};
  EXPECT_EQ(link_bytes(call, 3), 600 * 4 * 2 / 3);
  call.send_counts = {0, 30, 0};
  call.recv_counts = {0, 300, 300};
  EXPECT_EQ(link_bytes(call, 3), 600 * 4 * 2 / 3);
}

}  // namespace
}  // namespace meshtensor::comm
