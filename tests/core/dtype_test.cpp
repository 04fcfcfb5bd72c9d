#include <cmath>
#include <limits>

#include <gtest/gtest.h>

#include <meshtensor/core/dtype.hpp>

#include "support/error_message.hpp"

namespace meshtensor {
namespace {

TEST(DType, NamesParseBackToTheSameDType) {
  for (DType dtype : kAllDTypes)
    EXPECT_EQ(parse_dtype(dtype_name(dtype)), dtype);
}

TEST(DType, SizesMatchStorageTypes) {
  EXPECT_EQ(dtype_size(DType::f64), 8u);
  EXPECT_EQ(dtype_size(DType::f32), 4u);
  EXPECT_EQ(dtype_size(DType::bf16), 2u);
  EXPECT_EQ(dtype_size(DType::f16), 2u);
  EXPECT_EQ(dtype_size(DType::i64), 8u);
  EXPECT_EQ(dtype_size(DType::i32), 4u);
  EXPECT_EQ(dtype_size(DType::u8), 1u);
  EXPECT_TRUE(is_floating(DType::bf16));
  EXPECT_FALSE(is_floating(DType::i32));
}

TEST(DType, UnknownNameIsRejectedWithTheTokenAndTheChoices) {
  EXPECT_THROW(parse_dtype("float32"), ParseError);
  const std::string message = testing::error_message([] { parse_dtype("float32"); });
  EXPECT_NE(message.find("'float32'"), std::string::npos);
  EXPECT_NE(message.find("f64, f32, bf16"), std::string::npos);
}

TEST(DType, IntegerConversionRoundsAndSaturates) {
  EXPECT_EQ(element_from_double<std::int32_t>(2.5), 2);  // ties to even
  EXPECT_EQ(element_from_double<std::int32_t>(-3.5), -4);
  EXPECT_EQ(element_from_double<std::int32_t>(1e12), std::numeric_limits<std::int32_t>::max());
  EXPECT_EQ(element_from_double<std::int32_t>(-1e12), std::numeric_limits<std::int32_t>::min());
  EXPECT_EQ(element_from_double<std::uint8_t>(-5.0), 0);
  EXPECT_EQ(element_from_double<std::uint8_t>(255.4), 255);
  EXPECT_EQ(element_from_double<std::uint8_t>(300.0), 255);
  EXPECT_EQ(element_from_double<std::int64_t>(1e30), std::numeric_limits<std::int64_t>::max());
  EXPECT_EQ(element_from_double<std::int64_t>(std::nan("")), 0);
  EXPECT_EQ(element_from_double<std::int64_t>(-0x1p63), std::numeric_limits<std::int64_t>::min());
}

}  // namespace
}  // namespace meshtensor
