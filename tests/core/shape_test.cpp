#include <gtest/gtest.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/core/shape.hpp>

#include "support/error_message.hpp"

namespace meshtensor {
namespace {

std::string parse_error(std::string_view text) {
  return testing::error_message([&] { parse_shape(text); });
}

TEST(Shape, CountsElementsAndStrides) {
  const Shape shape{4, 3, 2};
  EXPECT_EQ(shape.rank(), 3);
  EXPECT_EQ(shape.numel(), 24);
  EXPECT_EQ(shape.contiguous_strides(), (std::vector<std::int64_t>{6, 2, 1}));
  EXPECT_EQ(shape.to_string(), "4x3x2");
  EXPECT_EQ(Shape{}.numel(), 1);
  EXPECT_EQ(Shape{}.to_string(), "scalar");
  EXPECT_EQ((Shape{5, 0, 7}).numel(), 0);
}

TEST(Shape, RejectsNegativeDimsAndOverflow) {
  EXPECT_THROW((Shape{2, -1}), InvalidArgument);
  EXPECT_THROW((Shape{1 << 20, 1 << 20, 1 << 20}), InvalidArgument);
  EXPECT_THROW((Shape{2, 3}).at(2), InvalidArgument);
}

TEST(Shape, ParsesDimsJoinedByX) {
  EXPECT_EQ(parse_shape("16x16x16"), (Shape{16, 16, 16}));
  EXPECT_EQ(parse_shape("5"), (Shape{5}));
  EXPECT_EQ(parse_shape("0x3"), (Shape{0, 3}));
}

TEST(Shape, BadTextNamesTheTokenAndTheFormat) {
  EXPECT_NE(parse_error("").find("expected dims joined by 'x'"), std::string::npos);
  EXPECT_NE(parse_error("4xa").find("'a' is not a non-negative integer"), std::string::npos);
  EXPECT_NE(parse_error("4x-1").find("'-1'"), std::string::npos);
  EXPECT_NE(parse_error("4xx2").find("empty dim"), std::string::npos);
  EXPECT_NE(parse_error("99999999999999999999").find("too large"), std::string::npos);
  EXPECT_NE(parse_error("65536x65536x65536x2").find("more than 2^48"), std::string::npos);
}

}  // namespace
}  // namespace meshtensor
