// The replicate dimension across replica groups as a Communicator: every collective over Gloo
// gives the threads backend's bits for the same inputs in the same member order.
#include <future>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <meshtensor/comm/threads_backend.hpp>
#include <meshtensor/ft/coordinator.hpp>
#include <meshtensor/ft/group_communicator.hpp>
#include <meshtensor/ft/group_context.hpp>

namespace meshtensor::ft {
namespace {

constexpr int kGroups = 3;

/// Runs the same collectives on `group` (rank r of kGroups) and returns every result, by name.
std::map<std::string, Tensor> collectives(comm::Communicator& group) {
  const auto r = static_cast<std::uint64_t>(group.rank());
  std::map<std::string, Tensor> out;
  for (const comm::ReductionMode mode :
       {comm::ReductionMode::ordered, comm::ReductionMode::exact}) {
    Tensor x = Tensor::random_normal(Shape{1001}, DType::f32, 7 + r);
    comm::CollectiveOptions options;
    options.mode = mode;
    group.all_reduce(x, options);
    out[std::string("all_reduce ") + std::string(comm::reduction_mode_name(mode))] = x;
    Tensor input = Tensor::random_normal(Shape{10}, DType::f32, 17 + r);
    Tensor shard = Tensor::zeros(Shape{r == 0 ? 2 : 4}, DType::f32);
    group.reduce_scatter(input, shard, {2, 4, 4}, options);
    out[std::string("reduce_scatter ") + std::string(comm::reduction_mode_name(mode))] = shard;
  }
  Tensor m = Tensor::random_normal(Shape{33}, DType::f64, 27 + r);
  comm::CollectiveOptions max;
  max.op = ReduceOp::max;
  group.all_reduce(m, max);
  out["all_reduce max"] = m;
  Tensor mine = Tensor::random_normal(Shape{static_cast<std::int64_t>(r) + 1}, DType::f32, 37 + r);
  Tensor all = Tensor::zeros(Shape{6}, DType::f32);
  group.all_gather(mine, all, {1, 2, 3});
  out["all_gather"] = all;
  Tensor b = Tensor::random_normal(Shape{5}, DType::f32, 47 + r);
  group.broadcast(b, 2);
  out["broadcast"] = b;
  Tensor send = Tensor::random_normal(Shape{3}, DType::f32, 57 + r);
  Tensor receive = Tensor::zeros(Shape{3}, DType::f32);
  group.all_to_all(send, receive);
  out["all_to_all"] = receive;
  group.barrier();
  return out;
}

TEST(GroupCommunicator, EveryCollectiveHasTheThreadsBackendsBits) {
  std::vector<std::map<std::string, Tensor>> threads(kGroups);
  comm::run_threads(kGroups, [&](comm::Communicator& world) {
    threads[static_cast<std::size_t>(world.rank())] = collectives(world);
  });
  Coordinator coordinator({"127.0.0.1", 0, {30.0, 0.5}});
  coordinator.start();
  const std::string address = "127.0.0.1:" + std::to_string(coordinator.port());
  std::vector<std::future<std::map<std::string, Tensor>>> groups;
  for (std::int64_t g = 0; g < kGroups; ++g) {
    groups.push_back(std::async(std::launch::async, [&, g] {
      CoordinatorClient client(address, g, {kGroups, kGroups, "test"}, 5.0);
      GroupContext context(address, g, client.quorum(0, 10.0), "shard0", "127.0.0.1", 10.0);
      GroupCommunicator communicator(context);
      EXPECT_EQ(communicator.rank(), g);
      EXPECT_EQ(communicator.backend(), "gloo");
      return collectives(communicator);
    }));
  }
  for (int g = 0; g < kGroups; ++g) {
    const std::map<std::string, Tensor> gloo = groups[static_cast<std::size_t>(g)].get();
    ASSERT_EQ(gloo.size(), threads[static_cast<std::size_t>(g)].size());
    for (const auto& [name, tensor] : gloo) {
      EXPECT_TRUE(tensor.bitwise_equal(threads[static_cast<std::size_t>(g)].at(name)))
          << name << " on group " << g;
    }
  }
}

}  // namespace
}  // namespace meshtensor::ft
