#include <atomic>
#include <chrono>
#include <cmath>
#include <mutex>
#include <thread>

#include <gtest/gtest.h>

#include <meshtensor/comm/binned_reduction.hpp>
#include <meshtensor/comm/mesh_groups.hpp>
#include <meshtensor/comm/threads_backend.hpp>
#include <meshtensor/core/error.hpp>
#include <meshtensor/fsdp/reduction.hpp>
#include <meshtensor/fsdp/sharded_model.hpp>
#include <meshtensor/kernels/binned_sum.hpp>
#include <meshtensor/kernels/elementwise.hpp>
#include <meshtensor/mesh/layout.hpp>
#include <meshtensor/nn/layers.hpp>
#include <meshtensor/nn/optim.hpp>

#include "support/spread_values.hpp"

namespace meshtensor::fsdp {
namespace {

using Clock = std::chrono::steady_clock;

std::shared_ptr<comm::Communicator> borrow(comm::Communicator& world) {
  return {&world, [](comm::Communicator*) {}};
}

/// A module with one vector parameter whose backward reports a gradient chosen by the test:
/// grad[j] += sum over rows of `grad_output` (so the test picks each rank's contribution), and
/// reports to the parameter only while `report` is true.
class ColumnSum : public nn::Module {
 public:
  ColumnSum(std::int64_t features, std::string name) {
    weight_.name = std::move(name);
    weight_.value = Tensor::zeros(Shape{features}, DType::f32);
  }
  Tensor forward(const Tensor& input) override { return input; }
  Tensor backward(const Tensor& grad_output, nn::GradientSink& sink, bool) override {
    if (report) sink.add_column_sums(weight_, grad_output);
    return grad_output;
  }
  std::vector<nn::Parameter*> parameters() override { return {&weight_}; }
  std::string describe() const override { return "ColumnSum"; }
  bool report = true;

 private:
  nn::Parameter weight_;
};

TEST(ShardLayout, FollowsTorchChunkOnAnyDimIncludingEmptyTrailingShards) {
  // 3 rows over 4 ranks: torch.chunk gives 1, 1, 1 and nothing; 10 columns over 4: 3, 3, 3, 1.
  const ShardLayout layout({Shape{3, 5}, Shape{2, 10}}, {0, 1}, 4);
  EXPECT_EQ(layout.chunk_shape(0, 3), Shape({0, 5}));
  EXPECT_EQ(layout.chunk_shape(1, 3), Shape({2, 1}));
  EXPECT_EQ(layout.counts(), (std::vector<std::int64_t>{5 + 6, 5 + 6, 5 + 6, 0 + 2}));
  const Tensor a = Tensor::arange(Shape{3, 5}, DType::f32);
  const Tensor b = Tensor::arange(Shape{2, 10}, DType::f32);
  Tensor flat(Shape{layout.total()}, DType::f32);
  layout.pack(std::vector<Tensor>{a, b}, flat);
  // Rank 1's segment: row 1 of a, then columns 3..5 of b.
  const Tensor segment = flat.narrow(0, 11, 11);
  EXPECT_TRUE(layout.chunk_view(segment, 0, 1).bitwise_equal(a.narrow(0, 1, 1).contiguous()));
  EXPECT_TRUE(layout.chunk_view(segment, 1, 1).bitwise_equal(b.narrow(1, 3, 3).contiguous()));
  std::vector<Tensor> back{Tensor::zeros(Shape{3, 5}, DType::f32),
                           Tensor::zeros(Shape{2, 10}, DType::f32)};
  layout.unpack(flat, back);
  EXPECT_TRUE(back[0].bitwise_equal(a));
  EXPECT_TRUE(back[1].bitwise_equal(b));
  EXPECT_THROW(ShardLayout({Shape{4}}, {1}, 2), InvalidArgument);
}

TEST(DivideFactors, SumThenDivideOnceExceptF16WhichSplitsAroundSqrtN) {
  EXPECT_EQ(divide_factors(DType::f32, 8, 8.0).pre, 1.0);
  EXPECT_EQ(divide_factors(DType::bf16, 8, 8.0).post, 8.0);
  const DivideFactors f16 = divide_factors(DType::f16, 16, 16.0);
  EXPECT_EQ(f16.pre, 4.0);
  EXPECT_EQ(f16.post, 4.0);
  const DivideFactors user = divide_factors(DType::f16, 8, 256.0);
  EXPECT_EQ(user.pre * user.post, 256.0);
  EXPECT_THROW(divide_factors(DType::f32, 4, 0.0), InvalidArgument);
  EXPECT_THROW(exact_divisor(2.5), InvalidArgument);
  EXPECT_EQ(exact_divisor(256.0), 256);
}

/// Runs one backward of a ColumnSum model on every rank of `mesh` (threads) with rank r
/// contributing `contribution(r)` to every element, and returns each rank's gradient shard.
std::vector<std::vector<float>> reduce_once(const DeviceMesh& mesh, const FsdpConfig& config,
                                            std::int64_t features,
                                            const std::function<float(int)>& contribution) {
  std::vector<std::vector<float>> shards(static_cast<std::size_t>(mesh.size()));
  comm::run_threads(static_cast<int>(mesh.size()), [&](comm::Communicator& world) {
    comm::MeshGroups groups(mesh, borrow(world));
    ColumnSum module(features, "w");
    ShardedModel model(module, groups);
    model.fully_shard(module, config);
    model.forward(Tensor::zeros(Shape{1, features}, DType::f32));
    model.backward(Tensor::full(Shape{1, features}, DType::f32, contribution(world.rank())));
    const Tensor grad = model.modules()[0]->local_grad(0);
    shards[static_cast<std::size_t>(world.rank())].assign(grad.values<float>().begin(),
                                                          grad.values<float>().end());
  });
  return shards;
}

TEST(GradientDivide, F16GradientsNearTheTopOfTheRangeDoNotOverflow) {
  // 8 ranks of 30000 each: the f16 sum (240000) is past 65504; pre-dividing keeps it in range.
  Tensor naive = Tensor::full(Shape{1}, DType::f32, 240000.0);
  EXPECT_TRUE(std::isinf(kernels::convert(naive, DType::f16).get(std::vector<std::int64_t>{0})));
  FsdpConfig config;
  config.reduce_dtype = DType::f16;
  const auto shards = reduce_once(DeviceMesh({8}), config, 16, [](int) { return 30000.0f; });
  for (const auto& shard : shards)
    for (const float g : shard)
      EXPECT_EQ(g, 30000.0f);
}

TEST(GradientDivide, FactorsComeFromTheGroupsReducedOverAndAUserFactorReplacesThem) {
  FsdpConfig hsdp;
  hsdp.replicate_mesh_dims = {0};
  // 2x2 mesh, rank r contributes r + 1: sum 10 over 4 ranks, default factor 4.
  for (const auto& shard :
       reduce_once(DeviceMesh({2, 2}), hsdp, 6, [](int r) { return static_cast<float>(r + 1); }))
    for (const float g : shard)
      EXPECT_EQ(g, 2.5f);
  std::vector<std::vector<float>> user(4);
  comm::run_threads(4, [&](comm::Communicator& world) {
    comm::MeshGroups groups(DeviceMesh({2, 2}), borrow(world));
    ColumnSum module(6, "w");
    ShardedModel model(module, groups);
    model.fully_shard(module, hsdp);
    model.set_gradient_divide_factor(10.0);
    model.forward(Tensor::zeros(Shape{1, 6}, DType::f32));
    model.backward(Tensor::full(Shape{1, 6}, DType::f32, world.rank() + 1.0));
    for (const float g : model.modules()[0]->local_grad(0).values<float>())
      EXPECT_EQ(g, 1.0f);
  });
}

TEST(GradientDivide, HsdpReduceScatterOnlyMicroBatchesDivideByShardThenReplicaSize) {
  // 2 replicas x 2 shards, 2 micro-batches: the first reduce-scatters only (its shard sums
  // divided by the shard size 2 wait in f32), the second reduce-scatters and all-reduces (then
  // divides by the replica size 2). Rank r contributes (r + 1) * 2 then (r + 1) * 4: the mean over
  // the 4 ranks of the two micro-batches' sum is 10 * 6 / 4 = 15.
  comm::run_threads(4, [&](comm::Communicator& world) {
    comm::MeshGroups groups(DeviceMesh({2, 2}), borrow(world));
    ColumnSum module(4, "w");
    ShardedModel model(module, groups);
    FsdpConfig hsdp;
    hsdp.replicate_mesh_dims = {0};
    ShardedModule& group = model.fully_shard(module, hsdp);
    const float r = static_cast<float>(world.rank() + 1);
    model.set_is_last_backward(false);
    model.set_requires_all_reduce(false);
    model.forward(Tensor::zeros(Shape{1, 4}, DType::f32));
    model.backward(Tensor::full(Shape{1, 4}, DType::f32, r * 2));
    model.set_is_last_backward(true);
    model.set_requires_all_reduce(true);
    model.forward(Tensor::zeros(Shape{1, 4}, DType::f32));
    model.backward(Tensor::full(Shape{1, 4}, DType::f32, r * 4));
    for (const float g : group.local_grad(0).values<float>())
      EXPECT_EQ(g, 15.0f);
  });
}

TEST(MicroBatches, AChangeInWhichParametersGetGradientsIsAnErrorNamingTheParameter) {
  for (const bool no_sync : {true, false}) {
    try {
      comm::run_threads(2, [&](comm::Communicator& world) {
        comm::MeshGroups groups(DeviceMesh({2}), borrow(world));
        nn::Sequential root;
        root.add(std::make_unique<ColumnSum>(4, "a"));
        root.add(std::make_unique<ColumnSum>(4, "b"));
        ShardedModel model(root, groups);
        model.fully_shard(root);
        const Tensor ones = Tensor::full(Shape{1, 4}, DType::f32, 1.0);
        model.set_is_last_backward(false);
        if (no_sync) {
          model.set_requires_gradient_sync(false);
        } else {
          model.set_requires_all_reduce(false);
        }
        model.forward(ones);
        model.backward(ones);
        dynamic_cast<ColumnSum&>(root.at(1)).report = false;
        model.set_is_last_backward(true);
        model.set_requires_gradient_sync(true);
        model.set_requires_all_reduce(true);
        model.forward(ones);
        model.backward(ones);
      });
      ADD_FAILURE() << "no error";
    } catch (const InvalidArgument& error) {
      EXPECT_NE(std::string(error.what()).find("'1.b'"), std::string::npos) << error.what();
    }
  }
}

/// Module A is sharded over the whole 2x2 mesh, module B over mesh dim 1 only (replicated over
/// dim 0), and B's all-gather is the slow one: it is issued first, yet A's forward finishes before
/// it does, and the forward takes about the longer of the two gathers, not their sum.
TEST(PerGroupQueues, ComputeWaitsOnlyForTheGatherItNeeds) {
  using std::chrono::milliseconds;
  const comm::LinkDelay link = [](const comm::CollectiveCall& call,
                                  const std::vector<std::int64_t>& ranks) {
    if (call.kind != comm::CollectiveKind::all_gather || !call.label.starts_with("unshard"))
      return std::chrono::nanoseconds(0);
    return std::chrono::nanoseconds(ranks.size() == 2 ? milliseconds(400) : milliseconds(250));
  };
  std::mutex mutex;
  std::vector<TraceEvent> events;
  std::vector<double> forward_seconds;
  comm::run_threads(
      4,
      [&](comm::Communicator& world) {
        comm::MeshGroups groups(DeviceMesh({2, 2}), borrow(world));
        nn::Sequential root;
        root.add(std::make_unique<nn::Linear>(8, 8, 1));
        root.add(std::make_unique<nn::Linear>(8, 8, 2));
        ShardedModel model(root, groups);
        model.tracer().enable(Clock::now());
        ShardedModule& a = model.fully_shard(root.at(0), {}, "A");
        FsdpConfig over_dim_1;
        over_dim_1.shard_mesh_dims = {1};
        over_dim_1.replicate_mesh_dims = {0};
        ShardedModule& b = model.fully_shard(root.at(1), over_dim_1, "B");
        const auto start = Clock::now();
        const UnshardHandle slow = b.unshard();
        a.unshard();
        model.forward(Tensor::zeros(Shape{2, 8}, DType::f32));
        slow.wait();
        const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
        const std::lock_guard lock(mutex);
        forward_seconds.push_back(seconds);
        if (world.rank() == 0) events = model.tracer().events();
      },
      link);
  const auto end_of = [&](const std::string& name) {
    for (const TraceEvent& e : events)
      if (e.name == name) return e.begin_us + e.duration_us;
    ADD_FAILURE() << "no event " << name;
    return std::int64_t{0};
  };
  EXPECT_LT(end_of("forward A"), end_of("all_gather B"));
  for (const double seconds : forward_seconds) {
    EXPECT_GE(seconds, 0.4);
    EXPECT_LT(seconds, 0.6) << "the gathers ran one after the other (0.65 s)";
  }
}

TEST(IssueOrder, AGatherIssuedOutOfOrderIsADesyncErrorNamingModulesAndRanks) {
  try {
    comm::run_threads(4, [&](comm::Communicator& world) {
      comm::MeshGroups groups(DeviceMesh({4}), borrow(world));
      nn::Sequential root;
      root.add(std::make_unique<nn::Linear>(4, 4, 1));
      root.add(std::make_unique<nn::Linear>(4, 4, 2));
      ShardedModel model(root, groups);
      model.fully_shard(root.at(0), {}, "first");
      ShardedModule& second = model.fully_shard(root.at(1), {}, "second");
      if (world.rank() == 3) second.unshard();
      model.forward(Tensor::zeros(Shape{1, 4}, DType::f32));
    });
    ADD_FAILURE() << "no error";
  } catch (const DesyncError& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("unshard first"), std::string::npos) << message;
    EXPECT_NE(message.find("unshard second"), std::string::npos) << message;
    EXPECT_NE(message.find("world rank 3"), std::string::npos) << message;
  }
}

TEST(IssueOrder, ADifferentOrderAcrossQueuesIsCaughtByTheStepFingerprint) {
  // A and B gather on different groups of ranks, so the swapped order on rank 0 matches every
  // collective; the fingerprint compared after the first step still names it.
  try {
    comm::run_threads(4, [&](comm::Communicator& world) {
      comm::MeshGroups groups(DeviceMesh({2, 2}), borrow(world));
      nn::Sequential root;
      root.add(std::make_unique<nn::Linear>(4, 4, 1));
      root.add(std::make_unique<nn::Linear>(4, 4, 2));
      ShardedModel model(root, groups);
      model.fully_shard(root.at(0), {}, "A");
      FsdpConfig over_dim_1;
      over_dim_1.shard_mesh_dims = {1};
      over_dim_1.replicate_mesh_dims = {0};
      ShardedModule& b = model.fully_shard(root.at(1), over_dim_1, "B");
      if (world.rank() == 0) b.unshard();
      const Tensor y = model.forward(Tensor::zeros(Shape{1, 4}, DType::f32));
      model.backward(Tensor::full(Shape{1, 4}, DType::f32, 1.0));
    });
    ADD_FAILURE() << "no error";
  } catch (const DesyncError& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("'B'"), std::string::npos) << message;
    EXPECT_NE(message.find("world rank 0"), std::string::npos) << message;
    EXPECT_NE(message.find("world rank 1"), std::string::npos) << message;
  }
}

/// Trains a few steps of 8 equal Linear groups and returns rank 0's memory figures.
struct MemoryRun {
  MemoryTracker::Snapshot peak;
  MemoryTracker::Snapshot current;
  std::int64_t group_elements = 0;
};

MemoryRun run_for_memory(int ranks, bool shard, int prefetch) {
  MemoryRun run;
  std::mutex mutex;
  comm::run_threads(ranks, [&](comm::Communicator& world) {
    comm::MeshGroups groups(DeviceMesh({ranks}), borrow(world));
    nn::Sequential root;
    for (int i = 0; i < 8; ++i)
      root.add(std::make_unique<nn::Linear>(64, 64, static_cast<std::uint64_t>(i)));
    RuntimeOptions options;
    options.prefetch = prefetch;
    ShardedModel model(root, groups, options);
    FsdpConfig config;
    if (!shard) config.replicate_mesh_dims = {0};
    for (std::size_t i = 0; i < root.size(); ++i)
      model.fully_shard(root.at(i), config);
    nn::AdamW optimizer(model.optimizer_slots(), 0.0);
    model.memory().add(MemoryKind::optimizer_state, optimizer.state_bytes());
    for (int step = 0; step < 3; ++step) {
      model.zero_grad();
      model.forward(Tensor::random_normal(Shape{16, 64}, DType::f32, 7));
      model.backward(Tensor::random_normal(Shape{16, 64}, DType::f32, 8));
      optimizer.step(1e-3);
    }
    if (world.rank() == 0) {
      const std::lock_guard lock(mutex);
      run.peak = model.memory().peak();
      run.current = model.memory().current();
      run.group_elements = 64 * 64 + 64;
    }
  });
  return run;
}

TEST(Memory, FsdpPeakIsShardedStatePlusThePrefetchWindowOfUnshardedGroups) {
  const MemoryRun ddp = run_for_memory(4, false, 1);
  for (const int prefetch : {0, 1, 2}) {
    const MemoryRun fsdp = run_for_memory(4, true, prefetch);
    const std::int64_t sharded_state = fsdp.current.of(MemoryKind::parameters) +
                                       fsdp.current.of(MemoryKind::gradients) +
                                       fsdp.current.of(MemoryKind::optimizer_state);
    const std::int64_t ddp_state = ddp.current.of(MemoryKind::parameters) +
                                   ddp.current.of(MemoryKind::gradients) +
                                   ddp.current.of(MemoryKind::optimizer_state);
    // 1/4 of DDP's, up to the rounding of uneven chunks.
    EXPECT_LE(sharded_state, ddp_state / 4 + 8 * 4 * 16);
    // Unsharded at once: the group computing and the `prefetch` groups gathered ahead (their
    // parameters and all-gather buffers), the gradient sums of the group in backward and the
    // reduction in flight (its sums and packed buffer): 4 bytes per element each.
    const std::int64_t group_bytes = fsdp.group_elements * 4;
    const std::int64_t bound = sharded_state + (2 * (1 + prefetch) + 3) * group_bytes;
    EXPECT_LE(fsdp.peak.total(), bound) << "prefetch " << prefetch;
    EXPECT_LT(fsdp.peak.total(), ddp.peak.total() / 2) << "prefetch " << prefetch;
  }
}

TEST(Exact, ShardDimAndUnevenShardsDoNotChangeTheBits) {
  // Linear(10, 7) over 4 ranks: dim 0 splits 3,3,3,1, dim 1 splits 2,2,2,1.
  const auto train = [](int ranks, FsdpConfig config) {
    std::uint64_t digest = 0;
    comm::run_threads(ranks, [&](comm::Communicator& world) {
      comm::MeshGroups groups(DeviceMesh({ranks}), borrow(world));
      nn::Sequential root;
      root.add(std::make_unique<nn::Linear>(10, 7, 3));
      root.add(std::make_unique<nn::Linear>(7, 5, 4));
      RuntimeOptions options;
      options.mode = comm::ReductionMode::exact;
      ShardedModel model(root, groups, options);
      model.fully_shard(root.at(0), config);
      model.fully_shard(root.at(1), config);
      nn::SGD optimizer(model.optimizer_slots(), 0.9, 0.0);
      for (int step = 0; step < 3; ++step) {
        model.zero_grad();
        const Chunk rows = chunk_extent(12, ranks, world.rank());
        const Tensor x = Tensor::random_normal(Shape{12, 10}, DType::f32, 5 + step)
                             .narrow(0, rows.offset, rows.size)
                             .contiguous();
        model.set_gradient_divide_factor(12.0);
        const Tensor y = model.forward(x);
        model.backward(y);
        optimizer.step(0.1);
      }
      const std::uint64_t d = model.full_parameters_digest();
      if (world.rank() == 0) digest = d;
    });
    return digest;
  };
  FsdpConfig ddp;
  ddp.replicate_mesh_dims = {0};
  const std::uint64_t reference = train(1, {});
  EXPECT_EQ(train(4, ddp), reference);
  EXPECT_EQ(train(4, {}), reference);
  FsdpConfig dim1;
  dim1.shard_dim = 1;
  EXPECT_EQ(train(4, dim1), reference);
  EXPECT_EQ(train(3, dim1), reference);
}

TEST(Exact, ReducedBinnedSumsRoundAsTheSumsMergedInOnePlace) {
  // Every rank adds rows of its own (magnitudes far apart, so bins differ between ranks); the
  // reduction must round to what one accumulator holding every rank's rows rounds to, on every
  // rank, for uneven slices and for fewer elements than ranks, with a divisor.
  for (const int ranks : {1, 2, 3, 5}) {
    for (const std::int64_t count : {std::int64_t{3}, std::int64_t{1000}}) {
      const auto rows_of = [&](int rank) {
        return testing::spread_values(DType::f32, 4 * count, -60 + 20 * rank, 40, 30,
                                      17 + static_cast<std::uint64_t>(rank), rank)
            .reshape(Shape{4, count});
      };
      kernels::BinnedSums everything(count);
      for (int rank = 0; rank < ranks; ++rank)
        kernels::add_column_sums(everything, 0, rows_of(rank));
      Tensor expected(Shape{count}, DType::f32);
      kernels::round_binned_sums(everything, 3, expected);
      std::mutex mutex;
      std::vector<Tensor> results(static_cast<std::size_t>(ranks));
      comm::run_threads(ranks, [&](comm::Communicator& world) {
        kernels::BinnedSums mine(count);
        kernels::add_column_sums(mine, 0, rows_of(world.rank()));
        Tensor rounded(Shape{count}, DType::f32);
        kernels::BinnedSums received;
        for (int repeat = 0; repeat < 2; ++repeat)  // the buffer reused
          comm::reduce_binned_sums(world, mine, 3, rounded, "test", received);
        const std::lock_guard lock(mutex);
        results[static_cast<std::size_t>(world.rank())] = rounded;
      });
      for (const Tensor& result : results) {
        EXPECT_TRUE(
            std::equal(result.bytes().begin(), result.bytes().end(), expected.bytes().begin()))
            << ranks << " ranks, " << count << " elements";
      }
    }
  }
}

}  // namespace
}  // namespace meshtensor::fsdp
