// The planner as pure data: collective counts, groups, layouts between steps, errors, caching.
#include <random>

#include <gtest/gtest.h>

#include <meshtensor/mesh/layout.hpp>
#include <meshtensor/mesh/parse.hpp>
#include <meshtensor/plan/planner.hpp>

#include "support/error_message.hpp"
#include "support/random_specs.hpp"

namespace meshtensor::plan {
namespace {

Plan plan_of(const std::string& mesh, const std::string& from, const std::string& to,
             const std::string& shape, bool merge = true) {
  PlanOptions options;
  options.merge = merge;
  return make_plan(parse_mesh(mesh), parse_spec(from), parse_spec(to), parse_shape(shape),
                   DType::f32, options);
}

std::vector<const Step*> collectives(const Plan& plan) {
  std::vector<const Step*> out;
  for (const Step& step : plan.steps) {
    if (is_collective(step.kind)) out.push_back(&step);
  }
  return out;
}

TEST(Planner, PartialReplicatePartialIsOneAllReduce) {
  const Plan plan = plan_of("2x2x2", "P,R,P", "R,R,R", "16x16x16");
  ASSERT_EQ(plan.collectives(), 1);
  const Step& step = *collectives(plan)[0];
  EXPECT_EQ(step.kind, StepKind::all_reduce);
  EXPECT_EQ(step.group, (std::vector<int>{0, 2}));
  EXPECT_EQ(step.group_size, 4);
  EXPECT_EQ(plan_of("2x2x2", "P,R,P", "R,R,R", "16x16x16", false).collectives(), 2);
}

TEST(Planner, SeedZeroJaggedMeshIsOneAllReduceOverFortyRanks) {
  const Plan plan = plan_of("8x5x1", "P,P,R", "R,R,R", "64x64");
  ASSERT_EQ(plan.collectives(), 1);
  EXPECT_EQ(collectives(plan)[0]->group, (std::vector<int>{0, 1}));
  EXPECT_EQ(collectives(plan)[0]->group_size, 40);
}

TEST(Planner, ReduceScatterAndAllGatherServeTwoTensorDims) {
  const Plan scatter = plan_of("4x2", "P,P", "S0,S1", "13x7");
  ASSERT_EQ(scatter.collectives(), 1);
  EXPECT_EQ(collectives(scatter)[0]->kind, StepKind::reduce_scatter);
  EXPECT_EQ(collectives(scatter)[0]->group_size, 8);
  EXPECT_EQ(scatter.steps.front().kind, StepKind::local_pack);

  const Plan gather = plan_of("4x2", "S0,S1", "R,R", "13x7");
  ASSERT_EQ(gather.collectives(), 1);
  EXPECT_EQ(collectives(gather)[0]->kind, StepKind::all_gather);
  EXPECT_EQ(gather.steps.back().kind, StepKind::local_unpack);
  EXPECT_TRUE(collectives(gather)[0]->traffic.uneven);  // 13 rows over 4: 4,4,4,1
}

TEST(Planner, NestedShardsGatherAllRowsOfUnevenTensor) {
  // PyTorch's merged all_gather drops rows here; the plan must move all 15 elements.
  const Plan plan = plan_of("2x2", "S0,S0", "R,R", "5x3");
  ASSERT_EQ(plan.collectives(), 1);
  const Step& step = *collectives(plan)[0];
  EXPECT_EQ(step.group, (std::vector<int>{0, 1}));
  // Blocks hold 2,1,1,1 rows of 3: each rank receives the rows it lacks.
  EXPECT_EQ(step.traffic.recv_bytes, (std::vector<std::int64_t>{36, 48, 48, 48}));
}

TEST(Planner, CommutingStepsAreReorderedToMerge) {
  const Plan plan = plan_of("2x2x2", "P,S0,P", "R,R,R", "64x64");
  ASSERT_EQ(plan.collectives(), 2);
  EXPECT_EQ(collectives(plan)[0]->kind, StepKind::all_reduce);
  EXPECT_EQ(collectives(plan)[0]->group, (std::vector<int>{0, 2}));
  EXPECT_EQ(collectives(plan)[1]->kind, StepKind::all_gather);
  EXPECT_EQ(plan_of("2x2x2", "P,S0,P", "R,R,R", "64x64", false).collectives(), 3);
}

TEST(Planner, ShardToShardIsOneAllToAllForLargeTensors) {
  const Plan plan = plan_of("2x3", "S0,S1", "S1,S0", "1024x1024");
  ASSERT_EQ(plan.collectives(), 1);
  EXPECT_EQ(collectives(plan)[0]->kind, StepKind::all_to_all);
  EXPECT_EQ(collectives(plan)[0]->group_size, 6);
  EXPECT_FALSE(plan.materializes_full_tensor);
}

TEST(Planner, MixedSumAndAvgDivideOnceByAvgDims) {
  const Plan plan = plan_of("2x4", "P(avg),P", "R,R", "8x8");
  EXPECT_EQ(plan.collectives(), 1);
  EXPECT_EQ(plan.avg_divisor, 2);
  ASSERT_EQ(plan.steps.back().kind, StepKind::scale);
  EXPECT_EQ(plan.steps.back().divisor, 2);
}

TEST(Planner, ReplicateToPartialSumKeepsOnePosition) {
  const Plan plan = plan_of("2x2", "R,R", "P,R", "4x4");
  EXPECT_EQ(plan.collectives(), 0);
  ASSERT_EQ(plan.steps.size(), 1u);
  EXPECT_EQ(plan.steps[0].kind, StepKind::local_partial);
  EXPECT_EQ(plan.steps[0].keep_dims, (std::vector<int>{0}));
  EXPECT_TRUE(plan_of("2x2", "R,R", "P(max),R", "4x4").steps[0].keep_dims.empty());
}

TEST(Planner, SizeOneMeshDimsCostNothing) {
  const Plan plan = plan_of("4x1x1", "P,P,S0", "R,R,R", "8x8");
  ASSERT_EQ(plan.collectives(), 1);
  EXPECT_EQ(collectives(plan)[0]->group, (std::vector<int>{0}));
  EXPECT_TRUE(plan_of("1x1", "P,S0", "S1,R", "8x8").steps.empty());
}

TEST(Planner, NoMergeKeepsOneMeshDimPerCollective) {
  for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{
           {"P,P,P", "S0,S1,R"}, {"S0,S0,S1", "S1,R,S0"}, {"S0@2,S0@0,S0@1", "R,S0,R"}}) {
    const Plan plan = plan_of("2x3x2", from, to, "12x10", false);
    for (const Step* step : collectives(plan))
      EXPECT_EQ(step->group.size(), 1u) << explain(plan);
  }
}

TEST(Planner, MergedPlanNeverCostsMoreThanUnmerged) {
  std::mt19937_64 random(11);
  for (int round = 0; round < 200; ++round) {
    const testing::RandomCase c = testing::random_case(random, 4, 16);
    const Plan merged = make_plan(c.mesh, c.from, c.to, c.shape, DType::f32);
    PlanOptions options;
    options.merge = false;
    const Plan unmerged = make_plan(c.mesh, c.from, c.to, c.shape, DType::f32, options);
    EXPECT_LE(merged.cost_s, unmerged.cost_s * (1 + 1e-12)) << explain(merged) << explain(unmerged);
    EXPECT_LE(merged.collectives(), unmerged.collectives()) << explain(merged);
  }
}

TEST(Planner, StepsChainFromSourceLayoutsToTargetLayouts) {
  std::mt19937_64 random(5);
  for (int round = 0; round < 300; ++round) {
    const testing::RandomCase c = testing::random_case(random, 4, 16);
    for (bool merge : {true, false}) {
      PlanOptions options;
      options.merge = merge;
      const Plan plan = make_plan(c.mesh, c.from, c.to, c.shape, DType::f32, options);
      if (plan.steps.empty()) continue;
      for (std::int64_t r = 0; r < c.mesh.size(); ++r) {
        // Size-1 mesh dims may be normalised, so compare blocks, not specs.
        EXPECT_EQ(local_layout(c.mesh, plan.steps.front().before, c.shape, r),
                  local_layout(c.mesh, c.from, c.shape, r));
        EXPECT_EQ(local_layout(c.mesh, plan.steps.back().after, c.shape, r),
                  local_layout(c.mesh, c.to, c.shape, r))
            << explain(plan);
      }
      // Pack and unpack belong to their collective and carry its specs.
      const PlacementSpec* previous = nullptr;
      for (const Step& step : plan.steps) {
        if (step.kind == StepKind::local_pack || step.kind == StepKind::local_unpack) continue;
        if (previous != nullptr) {
          EXPECT_EQ(step.before.to_string(), previous->to_string()) << explain(plan);
        }
        previous = &step.after;
      }
    }
  }
}

TEST(Planner, SamePlanEveryTime) {
  const Plan a = plan_of("2x3x2", "S0,P,S1", "S1,S0,R", "7x11");
  const Plan b = plan_of("2x3x2", "S0,P,S1", "S1,S0,R", "7x11");
  EXPECT_EQ(to_json(a), to_json(b));
}

TEST(Planner, BadSpecsAreNamed) {
  using testing::error_message;
  EXPECT_NE(error_message([] {
              plan_of("2x2", "P(max),P", "R,R", "4");
            }).find("P(max),P(sum) mixes Partial kinds"),
            std::string::npos);
  EXPECT_NE(error_message([] {
              plan_of("2", "S2", "R", "4x4");
            }).find("shards tensor dim 2, but the tensor has rank 2"),
            std::string::npos);
  EXPECT_NE(error_message([] {
              plan_of("2x2", "R", "R,R", "4");
            }).find("spec R has 1 placements but mesh 2x2 has 2 dims"),
            std::string::npos);
}

TEST(PlanCache, ReturnsTheSamePlanPerKey) {
  PlanCache cache;
  const DeviceMesh mesh = parse_mesh("2x2");
  const auto a =
      cache.get(mesh, parse_spec("P,S0"), parse_spec("R,R"), parse_shape("8x8"), DType::f32);
  const auto b =
      cache.get(mesh, parse_spec("P,S0"), parse_spec("R,R"), parse_shape("8x8"), DType::f32);
  const auto c =
      cache.get(mesh, parse_spec("P,S0"), parse_spec("R,R"), parse_shape("8x8"), DType::f64);
  EXPECT_EQ(a.get(), b.get());
  EXPECT_NE(a.get(), c.get());
  EXPECT_EQ(cache.size(), 2u);
}

TEST(PlanJson, CountsCollectivesAndBytes) {
  const nlohmann::json json = to_json(plan_of("4x2", "P,P", "S0,S1", "16x16"));
  EXPECT_EQ(json["collectives"], 1);
  const auto& step = json["steps"][1];
  EXPECT_EQ(step["kind"], "reduce_scatter");
  EXPECT_EQ(step["group"], nlohmann::json::array({0, 1}));
  EXPECT_EQ(step["bytes_per_rank"]["send"].size(), 8u);
  EXPECT_EQ(step["max_send_bytes"], 7 * 32 * 4);  // 7/8 of 16x16 f32
}

}  // namespace
}  // namespace meshtensor::plan

namespace meshtensor::plan {
namespace {

Plan topology_plan(const std::string& mesh, const std::string& from, const std::string& to,
                   const std::string& shape, std::vector<std::int64_t> host_sizes,
                   LinkLevels links = default_links()) {
  PlanOptions options;
  const DeviceMesh parsed = parse_mesh(mesh);
  options.topology = Topology::from_host_sizes(parsed.size(), host_sizes, 0, links);
  return make_plan(parsed, parse_spec(from), parse_spec(to), parse_shape(shape), DType::f32,
                   options);
}

// (kind, group, two_level) of each collective.
std::vector<std::tuple<StepKind, std::vector<int>, bool>> shape_of(const Plan& plan) {
  std::vector<std::tuple<StepKind, std::vector<int>, bool>> out;
  for (const Step* step : collectives(plan))
    out.emplace_back(step->kind, step->group, step->two_level);
  return out;
}

TEST(TopologyPlanner, SeedZeroAllReduceRunsInTwoLevelsAcrossHosts) {
  // (ddp=8, fsdp=5) on hosts of 8: the 40-rank all_reduce spans 5 hosts, 8 ranks on each.
  const Plan plan = topology_plan("8x5", "P,P", "R,R", "1024x1024", {8});
  ASSERT_EQ(plan.collectives(), 1);
  const Step& step = *collectives(plan)[0];
  EXPECT_TRUE(step.two_level);
  EXPECT_EQ(step.level, LinkLevel::network);
  EXPECT_EQ(step.units, 5);
  EXPECT_EQ(step.per_unit, 8);
  EXPECT_LT(step.two_level_cost_s, step.flat_cost_s);
  EXPECT_TRUE(plan.blind_differs);
  EXPECT_GT(plan.blind_cost_s, 1.5 * plan.cost_s);
  const std::string text = explain(plan);
  EXPECT_NE(text.find("crosses: network (5 hosts x 8 ranks); two levels"), std::string::npos)
      << text;
  EXPECT_NE(text.find("topology-blind plan"), std::string::npos) << text;
}

TEST(TopologyPlanner, TopologyChangesWhichDimsMergeAndTheirOrder) {
  // Hosts of 4 on a 2x4 mesh: dim 1 stays inside a host, dim 0 crosses. The blind plan
  // reduce-scatters over both dims at once; the aware one reduces inside hosts first, so that
  // only a quarter of the bytes cross.
  const Plan blind = plan_of("2x4", "P,P", "S0,S1", "4096x512");
  const Plan aware = topology_plan("2x4", "P,P", "S0,S1", "4096x512", {4});
  ASSERT_EQ(blind.collectives(), 1);
  EXPECT_EQ(collectives(blind)[0]->group, (std::vector<int>{0, 1}));
  ASSERT_EQ(aware.collectives(), 2);
  EXPECT_EQ(collectives(aware)[0]->group, (std::vector<int>{1}));
  EXPECT_EQ(collectives(aware)[0]->level, LinkLevel::domain);
  EXPECT_EQ(collectives(aware)[1]->group, (std::vector<int>{0}));
  EXPECT_EQ(collectives(aware)[1]->level, LinkLevel::network);
  EXPECT_LT(aware.cost_s, aware.blind_cost_s);
  // Gathers go the other way: across hosts first, while the blocks are small.
  const Plan gather = topology_plan("4x2", "S0,S1", "R,R", "4096x512", {2});
  ASSERT_EQ(gather.collectives(), 2);
  EXPECT_EQ(collectives(gather)[0]->group, (std::vector<int>{0}));
  EXPECT_EQ(collectives(gather)[1]->group, (std::vector<int>{1}));
}

TEST(TopologyPlanner, OneHostGivesTheBlindPlan) {
  for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{
           {"P,P", "R,R"}, {"P,P", "S0,S1"}, {"S0,S1", "R,R"}, {"S0,R", "R,S1"}}) {
    const Plan blind = plan_of("8x5", from, to, "1024x512");
    const Plan one_host = topology_plan("8x5", from, to, "1024x512", {40});
    EXPECT_EQ(shape_of(blind), shape_of(one_host)) << from << " -> " << to;
    EXPECT_EQ(explain(blind), explain(one_host));
  }
}

TEST(TopologyPlanner, SmallTensorsStayFlat) {
  // Latency-bound: three collectives cost more than one.
  const Plan plan = topology_plan("8x5", "P,P", "R,R", "4x4", {8});
  ASSERT_EQ(plan.collectives(), 1);
  EXPECT_FALSE(collectives(plan)[0]->two_level);
  EXPECT_GE(collectives(plan)[0]->two_level_cost_s, collectives(plan)[0]->flat_cost_s);
  EXPECT_FALSE(plan.blind_differs);
}

Plan exact_topology_plan(const std::string& mesh, const std::string& from, const std::string& to,
                         const std::string& shape, std::vector<std::int64_t> host_sizes) {
  PlanOptions options;
  const DeviceMesh parsed = parse_mesh(mesh);
  options.topology = Topology::from_host_sizes(parsed.size(), host_sizes);
  options.order_sensitive = false;
  return make_plan(parsed, parse_spec(from), parse_spec(to), parse_shape(shape), DType::f32,
                   options);
}

TEST(TopologyPlanner, JaggedGroupsRunInTwoLevelsWhereThatPays) {
  // Mesh 5x2 on hosts of 6 (6 + 4 ranks): both groups along dim 0 sit 3 + 2. Across, a member
  // of the 2-rank side relays 3/10 of the buffer instead of sending 4/5 of it.
  const Plan plan = topology_plan("5x2", "P,R", "R,R", "1024x1024", {6});
  ASSERT_EQ(plan.collectives(), 1);
  const Step& step = *collectives(plan)[0];
  EXPECT_EQ(step.level, LinkLevel::network);
  EXPECT_TRUE(step.two_level);
  EXPECT_EQ(step.per_unit, 0);
  EXPECT_LT(step.two_level_cost_s, step.flat_cost_s * 0.6);
  EXPECT_NE(explain(plan).find("unevenly); two levels: inside each host, then across"),
            std::string::npos)
      << explain(plan);
  // A small tensor: three collectives' start-up cost more than the bytes they save.
  const Plan small = topology_plan("5x2", "P,R", "R,R", "8x8", {6});
  EXPECT_FALSE(collectives(small)[0]->two_level);
  EXPECT_GE(collectives(small)[0]->two_level_cost_s, collectives(small)[0]->flat_cost_s);
  // One member of each group per host: nothing to do inside a host.
  const Plan spread_out = topology_plan("5x8", "P,R", "R,R", "1024x1024", {8});
  EXPECT_LT(collectives(spread_out)[0]->two_level_cost_s, 0);
  EXPECT_NE(
      explain(spread_out).find("flat (two levels need a host holding 2 or more of its ranks)"),
      std::string::npos)
      << explain(spread_out);
}

TEST(TopologyPlanner, OrderedSumsStayFlatWhereGroupsSplitDifferently) {
  // Groups of 6 on hosts of 4 sit 4 + 2 and 2 + 4: ordered sums would add in two orders.
  const Plan ordered = topology_plan("2x6", "R,P", "R,R", "1024x1024", {4});
  const Step& flat = *collectives(ordered)[0];
  EXPECT_FALSE(flat.two_level);
  EXPECT_TRUE(flat.splits_differ);
  EXPECT_NE(explain(ordered).find("split over hosts differently"), std::string::npos)
      << explain(ordered);
  // Exact sums give the same bits in any order: two levels where cheaper.
  const Plan exact = exact_topology_plan("2x6", "R,P", "R,R", "1024x1024", {4});
  EXPECT_TRUE(collectives(exact)[0]->two_level);
  // Gathers have no order: two levels in either mode.
  const Plan gather = topology_plan("2x6", "R,S0", "R,R", "1024x1024", {4});
  EXPECT_TRUE(collectives(gather)[0]->two_level) << explain(gather);
  // Seed 000's fsdp groups include 1 + 4 (ranks 15..19): the lone rank sends 4/5 of the
  // buffer across in any form, so even exact sums (as slow as that group) stay flat.
  const Plan seed = exact_topology_plan("8x5", "R,P", "R,R", "1024x1024", {8});
  EXPECT_FALSE(collectives(seed)[0]->two_level);
  EXPECT_NE(explain(seed).find("(2 hosts, unevenly); flat, est"), std::string::npos)
      << explain(seed);
}

TEST(TopologyPlanner, AwarePlanNeverCostsMoreThanBlindOnRandomCases) {
  std::mt19937 random(36);
  const std::vector<std::string> meshes = {"8x5", "2x4", "4x2", "2x2x2", "4x3", "3x4"};
  const std::vector<std::string> specs = {"P,P",  "R,R",  "S0,S1", "S1,S0", "S0,S0",
                                          "R,S0", "S0,R", "P,S0",  "S1,P"};
  int compared = 0;
  for (int i = 0; i < 200; ++i) {
    const std::string mesh = meshes[random() % meshes.size()];
    const DeviceMesh parsed = parse_mesh(mesh);
    if (parsed.ndim() != 2) continue;
    const std::string from = specs[random() % specs.size()];
    const std::string to = specs[random() % specs.size()];
    if (to.find('P') != std::string::npos) continue;
    const std::int64_t per_host = 1 + static_cast<std::int64_t>(random() % 8);
    const Plan plan = topology_plan(mesh, from, to, "96x64", {per_host});
    if (plan.topology.single_level()) continue;  // one host: nothing to compare
    ++compared;
    EXPECT_LE(plan.cost_s, plan.blind_cost_s * (1 + 1e-12))
        << mesh << " " << from << " -> " << to << " hosts of " << per_host;
  }
  EXPECT_GT(compared, 50);
}

TEST(TopologyPlanner, TopologyMustMatchTheMesh) {
  PlanOptions options;
  options.topology = Topology::from_host_sizes(6, {4});
  const std::string message = testing::error_message([&] {
    make_plan(parse_mesh("8x5"), parse_spec("P,P"), parse_spec("R,R"), parse_shape("8x8"),
              DType::f32, options);
  });
  EXPECT_NE(message.find("a topology of 6 ranks (4,2 per host) for mesh 8x5"), std::string::npos)
      << message;
}

TEST(TopologyPlanner, CacheKeepsTopologiesApart) {
  PlanCache cache;
  PlanOptions blind;
  PlanOptions aware;
  aware.topology = Topology::from_host_sizes(40, {8});
  const auto a = cache.get(parse_mesh("8x5"), parse_spec("P,P"), parse_spec("R,R"),
                           parse_shape("1024x1024"), DType::f32, blind);
  const auto b = cache.get(parse_mesh("8x5"), parse_spec("P,P"), parse_spec("R,R"),
                           parse_shape("1024x1024"), DType::f32, aware);
  EXPECT_EQ(cache.size(), 2U);
  EXPECT_FALSE(collectives(*a)[0]->two_level);
  EXPECT_TRUE(collectives(*b)[0]->two_level);
  const nlohmann::json json = to_json(*b);
  EXPECT_EQ(json["steps"][0]["level"], "network");
  EXPECT_EQ(json["steps"][0]["two_level"], true);
  EXPECT_EQ(json["topology"]["hosts"], 5);
  EXPECT_EQ(json["topology"]["differs_from_blind"], true);
}

}  // namespace
}  // namespace meshtensor::plan
