#include <gtest/gtest.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/mesh/spec.hpp>

#include "support/error_message.hpp"

namespace meshtensor {
namespace {

using testing::error_message;

TEST(PlacementSpec, DefaultShardOrderIsAscendingMeshDims) {
  const PlacementSpec spec({Placement::shard(0), Placement::replicate(), Placement::shard(0)});
  EXPECT_EQ(spec.shard_mesh_dims(0), (std::vector<int>{0, 2}));
  EXPECT_TRUE(spec.has_default_shard_order());
  EXPECT_EQ(spec.to_string(), "S0,R,S0");
}

TEST(PlacementSpec, ExplicitShardOrderIsKeptAndPrinted) {
  const PlacementSpec spec({Placement::shard(0), Placement::shard(1), Placement::shard(0)},
                           {1, 0, 0});
  EXPECT_EQ(spec.shard_mesh_dims(0), (std::vector<int>{2, 0}));
  EXPECT_EQ(spec.shard_mesh_dims(1), (std::vector<int>{1}));
  EXPECT_FALSE(spec.has_default_shard_order());
  EXPECT_EQ(spec.to_string(), "S0@1,S1@0,S0@0");
  // Levels equal to the default order are the default spec.
  EXPECT_EQ(PlacementSpec({Placement::shard(0), Placement::shard(0)}, {0, 1}),
            PlacementSpec({Placement::shard(0), Placement::shard(0)}));
}

TEST(PlacementSpec, ShardLevelsMustBeAPermutation) {
  EXPECT_NE(error_message([] {
              PlacementSpec({Placement::shard(0), Placement::shard(0)}, {1, 1});
            }).find("need levels 0..1 once each, got [1,1]"),
            std::string::npos);
  EXPECT_THROW(PlacementSpec({Placement::shard(0)}, {0, 0}), InvalidArgument);
}

TEST(PlacementSpec, OnlySumAndAvgPartialsMix) {
  EXPECT_NO_THROW(
      PlacementSpec({Placement::partial(ReduceOp::sum), Placement::partial(ReduceOp::avg)}));
  EXPECT_NO_THROW(
      PlacementSpec({Placement::partial(ReduceOp::max), Placement::partial(ReduceOp::max)}));
  for (const auto& pair :
       {std::pair{ReduceOp::sum, ReduceOp::max}, std::pair{ReduceOp::avg, ReduceOp::min},
        std::pair{ReduceOp::max, ReduceOp::min}}) {
    const ReduceOp a = pair.first;
    const ReduceOp b = pair.second;
    const std::string message = error_message([&] {
      PlacementSpec({Placement::partial(a), Placement::partial(b)});
    });
    EXPECT_NE(message.find("mixes Partial kinds"), std::string::npos) << message;
    EXPECT_NE(message.find(std::string(reduce_op_name(b))), std::string::npos) << message;
  }
}

TEST(PlacementSpec, ValidateChecksMeshAndTensorRank) {
  const PlacementSpec spec({Placement::shard(2), Placement::replicate()});
  EXPECT_NO_THROW(spec.validate(DeviceMesh({2, 2}), 3));
  EXPECT_NE(error_message([&] {
              spec.validate(DeviceMesh({2, 2}), 2);
            }).find("spec S2,R shards tensor dim 2, but the tensor has rank 2"),
            std::string::npos);
  EXPECT_NE(error_message([&] {
              spec.validate(DeviceMesh({2, 2, 2}), 3);
            }).find("has 2 placements but mesh 2x2x2 has 3 dims"),
            std::string::npos);
}

TEST(Placement, AccessorsCheckTheKind) {
  EXPECT_EQ(Placement::shard(3).shard_dim(), 3);
  EXPECT_EQ(Placement::partial(ReduceOp::avg).reduce_op(), ReduceOp::avg);
  EXPECT_THROW(Placement::replicate().shard_dim(), InvalidArgument);
  EXPECT_THROW(Placement::shard(0).reduce_op(), InvalidArgument);
  EXPECT_THROW(Placement::shard(-1), InvalidArgument);
  EXPECT_EQ(Placement::partial().to_string(), "P(sum)");
}

}  // namespace
}  // namespace meshtensor
