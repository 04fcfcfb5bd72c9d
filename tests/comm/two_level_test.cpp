// Collectives in two levels (inside hosts, then across) on a threads world with a topology: the
// documented order in ordered mode, the flat collective's bits in exact mode, any counts.
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

TEST(TwoLevel, JaggedGroupsRunFlatAndGroupsAreCached) {
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
        const bool flat_row = dynamic_cast<TwoLevelCommunicator*>(jagged.get()) == nullptr;
        const auto* two = dynamic_cast<TwoLevelCommunicator*>(whole.get());
        const bool cached = groups.two_level_group(all, TwoLevelChoice::always) == whole;
        Tensor ones = Tensor::full({5}, DType::f32, 1.0);
        whole->all_reduce(ones);
        if (flat_row && two != nullptr && two->units() == 3 && two->per_unit() == 4 && cached &&
            ones.values<float>()[4] == 12.0F)
          ++good;
      },
      SimulatedNetwork({}, three_hosts()));
  EXPECT_EQ(good.load(), kRanks);
}

TEST(TwoLevel, SimulatedLinkChargesTheLevelCrossed) {
  const Topology topology = Topology::from_host_sizes(
      8, {4}, 0, {LinkFigures{1e-6, 1e9}, LinkFigures{2e-6, 1e9}, LinkFigures{1e-3, 1e9}});
  const LinkDelay link = simulated_topology_link(topology);
  CollectiveCall call;
  call.kind = CollectiveKind::barrier;
  EXPECT_EQ(link(call, {0, 1, 2}), std::chrono::nanoseconds(1000));
  EXPECT_EQ(link(call, {3, 4}), std::chrono::nanoseconds(1000000));
}

}  // namespace
}  // namespace meshtensor::comm
