#include <gtest/gtest.h>

#include <meshtensor/comm/mesh_groups.hpp>
#include <meshtensor/comm/threads_backend.hpp>
#include <meshtensor/fsdp/sharded_model.hpp>
#include <meshtensor/fsdp/unit_gather.hpp>
#include <meshtensor/mesh/layout.hpp>
#include <meshtensor/nn/layers.hpp>
#include <meshtensor/nn/optim.hpp>

namespace meshtensor::fsdp {
namespace {

const std::vector<int> kShardDims{1};
const std::vector<int> kReplicateDims{0};

std::optional<UnitGather> plan(const std::vector<std::int64_t>& mesh, const Topology& topology,
                               std::int64_t rank) {
  return plan_unit_gather(DeviceMesh(mesh), topology, kShardDims, kReplicateDims, rank);
}

TEST(UnitGather, SeedMeshTakesEveryShardFromItsOwnHostInShardOrder) {
  // HSDP 8x5 on hosts of 8: rank (replica i, shard j) is 5i + j; host 1 holds ranks 8..15, group
  // positions (shard-major, 8 replicas a shard) 25, 33, 2, 10, 18, 26, 34, 3.
  const Topology hosts = Topology::from_host_sizes(40, {8});
  const std::optional<UnitGather> host1 = plan({8, 5}, hosts, 8);
  ASSERT_TRUE(host1.has_value());
  EXPECT_EQ(host1->shard_of_place, (std::vector<int>{0, -1, 1, 2, 3, -1, 4, -1}));
  for (std::int64_t rank = 0; rank < 40; ++rank) {
    const std::optional<UnitGather> mine = plan({8, 5}, hosts, rank);
    ASSERT_TRUE(mine.has_value()) << rank;
    std::vector<int> senders;
    for (const int shard : mine->shard_of_place)
      if (shard >= 0) senders.push_back(shard);
    EXPECT_EQ(senders, (std::vector<int>{0, 1, 2, 3, 4})) << "rank " << rank;
    EXPECT_EQ(mine->shard_of_place.size(), 8U);
  }
}

TEST(UnitGather, AppliesOnlyWhereAShardGroupCrossesAndEveryHostHoldsEveryShard) {
  // Shard groups inside a host (2x4 on hosts of 4): their own gather never crosses.
  EXPECT_FALSE(plan({2, 4}, Topology::from_host_sizes(8, {4}), 0).has_value());
  // A host without every shard (2x4 on hosts of 2: host 0 holds shards 0 and 1 only).
  EXPECT_FALSE(plan({2, 4}, Topology::from_host_sizes(8, {2}), 0).has_value());
  // One host: nothing to keep off the network.
  EXPECT_FALSE(plan({4, 2}, Topology::from_host_sizes(8, {8}), 0).has_value());
  // No replicas: plain FSDP.
  EXPECT_FALSE(plan({1, 8}, Topology::from_host_sizes(8, {4}), 0).has_value());
  // Jagged hosts of 3 (3 + 3 + 2) under 4x2: shard group {2, 3} crosses; every host holds both.
  const Topology jagged = Topology::from_host_sizes(8, {3});
  for (std::int64_t rank = 0; rank < 8; ++rank)
    EXPECT_TRUE(plan({4, 2}, jagged, rank).has_value()) << rank;
  EXPECT_EQ(plan({4, 2}, jagged, 7)->shard_of_place, (std::vector<int>{0, 1}));
}

/// Full-parameter digest after three ordered HSDP steps of two Linear layers on mesh 4x2
/// (replicas x shards) over hosts of 3; `gathered_on_host` reports which gather ran.
std::uint64_t train_hsdp(bool from_host_replicas, DType param_dtype, bool& gathered_on_host) {
  std::uint64_t digest = 0;
  comm::SimulatedNetwork network(comm::LinkDelay{}, Topology::from_host_sizes(8, {3}));
  comm::run_threads(
      8,
      [&](comm::Communicator& world) {
        comm::MeshGroups groups(DeviceMesh({4, 2}),
                                std::shared_ptr<comm::Communicator>(&world, [](auto*) {}));
        nn::Sequential root;
        root.add(std::make_unique<nn::Linear>(10, 7, 3));
        root.add(std::make_unique<nn::Linear>(7, 5, 4));
        ShardedModel model(root, groups, RuntimeOptions{});
        FsdpConfig config;
        config.replicate_mesh_dims = kReplicateDims;
        config.shard_mesh_dims = kShardDims;
        config.param_dtype = param_dtype;
        config.gather_from_host_replicas = from_host_replicas;
        const bool on_host = model.fully_shard(root.at(0), config).gathers_from_host_replicas();
        model.fully_shard(root.at(1), config);
        nn::SGD optimizer(model.optimizer_slots(), 0.9, 0.0);
        for (int step = 0; step < 3; ++step) {
          model.zero_grad();
          const Chunk rows = chunk_extent(16, 8, world.rank());
          const Tensor x = Tensor::random_normal(Shape{16, 10}, DType::f32, 5 + step)
                               .narrow(0, rows.offset, rows.size)
                               .contiguous();
          model.backward(model.forward(x));
          optimizer.step(0.1);
        }
        const std::uint64_t d = model.full_parameters_digest();
        if (world.rank() == 0) {
          digest = d;
          gathered_on_host = on_host;
        }
      },
      network);
  return digest;
}

TEST(UnitGather, HsdpGatheringOnTheHostGivesTheBitsOfTheShardGroupsGather) {
  for (const DType dtype : {DType::f32, DType::bf16}) {
    bool on_host = false;
    const std::uint64_t host = train_hsdp(true, dtype, on_host);
    EXPECT_TRUE(on_host);
    const std::uint64_t shard_group = train_hsdp(false, dtype, on_host);
    EXPECT_FALSE(on_host);
    EXPECT_EQ(host, shard_group) << dtype_name(dtype);
  }
}

}  // namespace
}  // namespace meshtensor::fsdp
