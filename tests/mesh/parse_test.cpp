#include <gtest/gtest.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/mesh/parse.hpp>

#include "support/error_message.hpp"

namespace meshtensor {
namespace {

// The message of the error `action` throws, which must be a ParseError.
template <class Action>
std::string parse_error(Action action) {
  EXPECT_THROW(action(), ParseError);
  return testing::error_message(action);
}

TEST(Parse, MeshesWithAndWithoutNames) {
  EXPECT_EQ(parse_mesh("2x2x2"), DeviceMesh({2, 2, 2}));
  EXPECT_EQ(parse_mesh("8x5x1", "ddp,fsdp,tp"), DeviceMesh({8, 5, 1}, {"ddp", "fsdp", "tp"}));
  EXPECT_EQ(parse_mesh("7"), DeviceMesh({7}));
}

TEST(Parse, PlacementsAndSpecs) {
  EXPECT_EQ(parse_placement("S12"), Placement::shard(12));
  EXPECT_EQ(parse_placement("R"), Placement::replicate());
  EXPECT_EQ(parse_placement("P"), Placement::partial(ReduceOp::sum));
  EXPECT_EQ(parse_placement("P(avg)"), Placement::partial(ReduceOp::avg));
  EXPECT_EQ(parse_placement("P(min)"), Placement::partial(ReduceOp::min));
  EXPECT_EQ(parse_spec("S0, R ,P(max)").to_string(), "S0,R,P(max)");
  EXPECT_EQ(parse_spec("S0@1,S0@0").shard_mesh_dims(0), (std::vector<int>{1, 0}));
  EXPECT_EQ(parse_spec("S0@0,S0@1"), parse_spec("S0,S0"));
  // Printing and parsing agree.
  for (const char* text : {"S0,R,P(sum)", "S1@1,S1@0,P(avg)", "R", "P(min),P(min)"}) {
    EXPECT_EQ(parse_spec(parse_spec(text).to_string()), parse_spec(text)) << text;
  }
}

TEST(Parse, ErrorsNameTheBadTokenAndWhatWasExpected) {
  struct Case {
    std::string message;
    const char* needle;
  };
  const Case cases[] = {
      {parse_error([] { parse_mesh(""); }), "empty mesh: expected sizes joined by 'x'"},
      {parse_error([] { parse_mesh("2x"); }), "mesh '2x' has an empty size"},
      {parse_error([] { parse_mesh("2x0"); }), "has a dim of size 0"},
      {parse_error([] { parse_mesh("2xfour"); }), "'four' is not a non-negative integer"},
      {parse_error([] { parse_mesh("2x2", "dp"); }), "1 dim names (dp) for a mesh of 2 dims"},
      {parse_error([] { parse_mesh("2x2", "dp,dp"); }), "'dp' is used twice"},
      {parse_error([] { parse_mesh("2x2", "dp,t-p"); }), "'t-p' is not an identifier"},
      {parse_error([] { parse_mesh("1048576x2"); }), "more than 1048576 ranks"},
      {parse_error([] { parse_spec(""); }), "empty spec"},
      {parse_error([] { parse_spec("S0,,R"); }), "empty placement: expected S<dim>, R, P"},
      {parse_error([] { parse_spec("S0,Q"); }), "unknown placement 'Q'"},
      {parse_error([] { parse_spec("S"); }), "placement 'S': empty"},
      {parse_error([] { parse_spec("Sx"); }), "placement 'Sx': 'x' is not a non-negative integer"},
      {parse_error([] { parse_spec("S-1"); }), "'-1' is not a non-negative integer"},
      {parse_error([] { parse_spec("S99"); }), "'99' is too large"},
      {parse_error([] { parse_spec("P(mean)"); }), "unknown reduce op 'mean'"},
      {parse_error([] { parse_spec("P(sum),P(max)"); }), "spec P(sum),P(max) mixes Partial kinds"},
      {parse_error([] { parse_spec("S0@1,S0"); }),
       "gives a shard level '@k' to some Shard placements but not all"},
      {parse_error([] { parse_spec("S0@1,S0@1"); }), "need levels 0..1 once each"},
      {parse_error([] { parse_spec("S0@x"); }), "shard level of placement 'S0@x'"},
      {parse_error([] { parse_placement("S0@0"); }), "belongs in a whole spec"},
      {parse_error([] { parse_spec("R,R,R,R,R,R,R,R,R,R,R,R,R,R,R,R,R"); }), "has 17 placements"},
  };
  for (const Case& c : cases)
    EXPECT_NE(c.message.find(c.needle), std::string::npos) << c.message;
}

}  // namespace
}  // namespace meshtensor
