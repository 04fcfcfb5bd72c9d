// Redistribute on the threads backend: random cases verified against the reference in every
// mode, exact bits independent of merging and mesh shape, the DTensor API, and fallbacks.
#include <random>

#include <gtest/gtest.h>

#include <meshtensor/comm/threads_backend.hpp>
#include <meshtensor/dtensor/check.hpp>
#include <meshtensor/dtensor/dtensor.hpp>
#include <meshtensor/mesh/layout.hpp>
#include <meshtensor/mesh/parse.hpp>

#include "support/error_message.hpp"
#include "support/random_specs.hpp"

namespace meshtensor::dtensor {
namespace {

CheckResult check(const CheckConfig& config) {
  CheckResult result;
  comm::run_threads(static_cast<int>(config.mesh.size()), [&](comm::Communicator& world) {
    const std::shared_ptr<comm::Communicator> shared(&world, [](comm::Communicator*) {});
    CheckResult mine = run_check(shared, config);
    if (world.rank() == 0) result = mine;
  });
  return result;
}

CheckConfig config_of(const std::string& mesh, const std::string& from, const std::string& to,
                      const std::string& shape, comm::ReductionMode mode, bool merge = true,
                      DType dtype = DType::f32) {
  CheckConfig config;
  config.mesh = parse_mesh(mesh);
  config.from = parse_spec(from);
  config.to = parse_spec(to);
  config.shape = parse_shape(shape);
  config.mode = mode;
  config.merge = merge;
  config.dtype = dtype;
  config.seed = 3;
  return config;
}

void check_random_cases(std::uint64_t seed, int rounds, std::int64_t max_ranks) {
  std::mt19937_64 random(seed);
  const DType dtypes[] = {DType::f32, DType::f64, DType::bf16, DType::f16,
                          DType::i32, DType::i64, DType::u8};
  for (int round = 0; round < rounds; ++round) {
    const testing::RandomCase c = testing::random_case(random, 4, max_ranks);
    CheckConfig config;
    config.mesh = c.mesh;
    config.from = c.from;
    config.to = c.to;
    config.shape = c.shape;
    config.dtype = dtypes[round % 7];
    config.seed = static_cast<std::uint64_t>(round);
    config.mode = static_cast<comm::ReductionMode>(round % 3);
    config.merge = round % 4 != 3;
    const CheckResult result = check(config);
    EXPECT_TRUE(result.ok) << result.message << " | mesh " << c.mesh.to_string() << " "
                           << c.from.to_string() << " -> " << c.to.to_string() << " shape "
                           << c.shape.to_string() << " " << dtype_name(config.dtype) << " mode "
                           << comm::reduction_mode_name(config.mode) << " merge " << config.merge;
  }
}

TEST(Redistribute, RandomCasesMatchTheReferenceInEveryMode) {
  check_random_cases(2026, 400, 16);
}

// Opt-in (MESHTENSOR_STRESS): many more random cases on larger meshes.
TEST(Redistribute, RandomCasesStress) {
  check_random_cases(77, 20000, 36);
}

TEST(Redistribute, ExactBitsDoNotDependOnMergingOrMeshShape) {
  using comm::ReductionMode;
  const std::vector<CheckConfig> configs = {
      config_of("8", "P", "R", "37x5", ReductionMode::exact),
      config_of("2x4", "P,P", "R,R", "37x5", ReductionMode::exact),
      config_of("2x4", "P,P", "R,R", "37x5", ReductionMode::exact, false),
      config_of("4x2", "P,P", "S0,S1", "37x5", ReductionMode::exact),
      config_of("2x2x2", "P,P,P", "R,R,R", "37x5", ReductionMode::exact),
      config_of("2x2x2", "P,P,P", "S1,R,S0", "37x5", ReductionMode::exact, false),
      config_of("2x2x2", "P,S0,P", "R,R,R", "37x5", ReductionMode::exact),
  };
  std::string digest;
  for (const CheckConfig& config : configs) {
    CheckConfig same = config;
    if (config.from.to_string() == "P(sum),S0,P(sum)") {
      // 4 contributions: compare with a 4-rank mesh instead.
      const CheckResult four = check(config_of("4", "P", "R", "37x5", ReductionMode::exact));
      const CheckResult result = check(config);
      ASSERT_TRUE(result.ok) << result.message;
      EXPECT_EQ(result.digest, four.digest);
      continue;
    }
    const CheckResult result = check(same);
    ASSERT_TRUE(result.ok) << result.message;
    if (digest.empty()) digest = result.digest;
    EXPECT_EQ(result.digest, digest) << config.mesh.to_string() << " " << config.to.to_string();
  }
}

TEST(Redistribute, ExactMixedSumAndAvgIsCorrectlyRoundedEitherWay) {
  using comm::ReductionMode;
  const CheckResult merged =
      check(config_of("2x4", "P(avg),P", "R,S1", "9x10", ReductionMode::exact));
  const CheckResult unmerged =
      check(config_of("2x4", "P(avg),P", "R,S1", "9x10", ReductionMode::exact, false));
  ASSERT_TRUE(merged.ok) << merged.message;
  ASSERT_TRUE(unmerged.ok) << unmerged.message;
  EXPECT_EQ(merged.digest, unmerged.digest);
}

TEST(Redistribute, OrderedSeedZeroCaseIsOneCollectiveOnFortyRanks) {
  const CheckResult result =
      check(config_of("8x5x1", "P,P,R", "R,R,R", "16x9", comm::ReductionMode::ordered));
  EXPECT_TRUE(result.ok) << result.message;  // includes: all 40 replicas bitwise equal
  EXPECT_EQ(result.collectives, 1);
}

TEST(Redistribute, CheckRejectsAWorldOfTheWrongSize) {
  const std::string message = testing::error_message([] {
    comm::run_threads(3, [](comm::Communicator& world) {
      const std::shared_ptr<comm::Communicator> shared(&world, [](comm::Communicator*) {});
      run_check(shared, config_of("2x2", "R,R", "R,R", "4", comm::ReductionMode::ordered));
    });
  });
  EXPECT_NE(message.find("mesh 2x2 has 4 ranks, but the world has 3"), std::string::npos)
      << message;
}

TEST(DTensor, DistributeRedistributeAndFullTensorRoundTrip) {
  const Tensor global = Tensor::random_normal({7, 5}, DType::f64, 9);
  comm::run_threads(6, [&](comm::Communicator& world) {
    const std::shared_ptr<comm::Communicator> shared(&world, [](comm::Communicator*) {});
    auto groups = std::make_shared<comm::MeshGroups>(parse_mesh("2x3"), shared);
    const DTensor sharded = distribute(global, groups, parse_spec("S1,S0"));
    EXPECT_EQ(sharded.local().shape(),
              local_layout(groups->mesh(), parse_spec("S1,S0"), global.shape(), world.rank())
                  .local_shape);
    const DTensor moved = sharded.redistribute(parse_spec("S0@1,S0@0"));
    EXPECT_TRUE(moved.full_tensor().bitwise_equal(global));
    // Partial(sum): one member keeps the values, so the sum is the tensor itself, exactly.
    RedistributeOptions exact;
    exact.mode = comm::ReductionMode::exact;
    const DTensor partial = distribute(global, groups, parse_spec("P,S1"));
    EXPECT_TRUE(partial.full_tensor(exact).bitwise_equal(global));
  });
}

TEST(DTensor, FromLocalRejectsAWrongBlock) {
  comm::run_threads(2, [](comm::Communicator& world) {
    const std::shared_ptr<comm::Communicator> shared(&world, [](comm::Communicator*) {});
    auto groups = std::make_shared<comm::MeshGroups>(parse_mesh("2"), shared);
    const std::string message = testing::error_message([&] {
      from_local(Tensor::zeros({5, 2}, DType::f32), groups, parse_spec("S0"), Shape({5, 2}));
    });
    const std::string expected = world.rank() == 0 ? "gives this rank a 3x2 block, not 5x2"
                                                   : "gives this rank a 2x2 block, not 5x2";
    EXPECT_NE(message.find(expected), std::string::npos) << message;
  });
}

TEST(Redistribute, ForbiddenFlattenedGroupsRunPerDimAndWarnOnce) {
  std::vector<std::string> warnings;
  std::mutex mutex;
  set_warning_handler([&](const std::string& message) {
    const std::lock_guard lock(mutex);
    warnings.push_back(message);
  });
  const Tensor global = Tensor::random_normal({6, 4}, DType::f32, 1);
  comm::run_threads(8, [&](comm::Communicator& world) {
    const std::shared_ptr<comm::Communicator> shared(&world, [](comm::Communicator*) {});
    auto groups = std::make_shared<comm::MeshGroups>(parse_mesh("2x2x2"), shared);
    RedistributeOptions options;
    options.allow_flattened_groups = false;
    for (int repeat = 0; repeat < 2; ++repeat) {
      const DTensor partial = distribute(global, groups, parse_spec("P,R,P"));
      EXPECT_TRUE(partial.redistribute(parse_spec("R,R,R"), options).local().bitwise_equal(global));
    }
    // Only the mesh's own dims were used: no group spans two dims.
    EXPECT_LE(groups->cached_groups(), 4u);
  });
  set_warning_handler(nullptr);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("flattened group over (dim0,dim2) not created"), std::string::npos)
      << warnings[0];
}

}  // namespace
}  // namespace meshtensor::dtensor

namespace meshtensor::dtensor {
namespace {

// A batch of redistributes: tensors of different shapes whose plans share their collectives
// run them once for all, and every tensor ends with the bits it has when moved alone; plans
// that reduce run alone.
TEST(ExecutePlans, ABatchMovesEveryTensorAsAloneWithTheCollectivesOfOne) {
  const DeviceMesh mesh = parse_mesh("2x2");
  struct Case {
    std::string from;
    std::string to;
    Shape shape;
  };
  const std::vector<Case> cases{{"S0,S1", "R,R", Shape{7, 5}},   {"S0,S1", "R,R", Shape{3, 9}},
                                {"S0,S1", "R,R", Shape{1, 1}},   {"S0,R", "S1,S0", Shape{6, 4}},
                                {"S0,R", "S1,S0", Shape{5, 7}},  {"P,R", "R,R", Shape{4}},
                                {"R,S0", "S0,R", Shape{9, 2, 3}}};
  std::vector<std::shared_ptr<const plan::Plan>> plans;
  for (const Case& c : cases)
    plans.push_back(plan_for(mesh, parse_spec(c.from), parse_spec(c.to), c.shape, DType::f32));
  std::vector<const plan::Plan*> raw;
  std::int64_t one_by_one = 0;
  for (const auto& p : plans) {
    raw.push_back(p.get());
    one_by_one += p->collectives();
  }
  EXPECT_LT(batch_collectives(raw), one_by_one);
  comm::run_threads(4, [&](comm::Communicator& world) {
    const std::shared_ptr<comm::Communicator> shared(&world, [](comm::Communicator*) {});
    comm::MeshGroups groups(mesh, shared);
    std::vector<Tensor> locals;
    std::vector<Tensor> alone;
    for (std::size_t i = 0; i < cases.size(); ++i) {
      const Tensor global = Tensor::random_normal(cases[i].shape, DType::f32, 40 + i);
      locals.push_back(
          local_view(global, local_layout(mesh, plans[i]->from, cases[i].shape, world.rank()))
              .clone());
      alone.push_back(execute_plan(*plans[i], groups, locals.back()));
    }
    const std::vector<Tensor> batch = execute_plans(raw, groups, locals);
    for (std::size_t i = 0; i < cases.size(); ++i)
      EXPECT_TRUE(batch[i].bitwise_equal(alone[i])) << cases[i].from << " -> " << cases[i].to;
    const std::vector<Tensor> wrong{Tensor::zeros({2}, DType::f32)};
    const std::vector<const plan::Plan*> first{raw.front()};
    EXPECT_THROW(execute_plans(first, groups, wrong), InvalidArgument);
  });
}

}  // namespace
}  // namespace meshtensor::dtensor
