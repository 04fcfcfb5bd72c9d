#include <vector>

#include <gtest/gtest.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/core/tensor.hpp>

#include "support/error_message.hpp"

namespace meshtensor {
namespace {

std::vector<double> all_values(const Tensor& tensor) {
  std::vector<double> out;
  const Tensor dense = tensor.contiguous();
  std::vector<std::int64_t> index(static_cast<std::size_t>(tensor.rank()), 0);
  for (std::int64_t i = 0; i < tensor.numel(); ++i) {
    std::int64_t rest = i;
    for (int d = tensor.rank() - 1; d >= 0; --d) {
      index[static_cast<std::size_t>(d)] = rest % tensor.shape()[d];
      rest /= tensor.shape()[d];
    }
    out.push_back(dense.get(index));
  }
  return out;
}

TEST(Tensor, FactoriesFillAsNamed) {
  EXPECT_EQ(all_values(Tensor::zeros({2, 2}, DType::i32)), (std::vector<double>{0, 0, 0, 0}));
  EXPECT_EQ(all_values(Tensor::full({3}, DType::bf16, 1.5)), (std::vector<double>{1.5, 1.5, 1.5}));
  EXPECT_EQ(all_values(Tensor::arange({2, 3}, DType::f16)),
            (std::vector<double>{0, 1, 2, 3, 4, 5}));
  const double values[] = {1, -2, 3.25};
  EXPECT_EQ(all_values(Tensor::from_values({3}, DType::f64, values)),
            (std::vector<double>{1, -2, 3.25}));
  EXPECT_THROW(Tensor::from_values({2}, DType::f64, values), InvalidArgument);
  EXPECT_THROW(Tensor::random_normal({2}, DType::i32, 1), InvalidArgument);
}

TEST(Tensor, NarrowIsAViewThatSharesStorage) {
  Tensor base = Tensor::arange({4, 5}, DType::f32);
  Tensor view = base.narrow(0, 1, 2).narrow(1, 2, 3);
  EXPECT_EQ(view.shape(), (Shape{2, 3}));
  EXPECT_FALSE(view.is_contiguous());
  EXPECT_EQ(all_values(view), (std::vector<double>{7, 8, 9, 12, 13, 14}));
  view.fill(-1);
  EXPECT_EQ(all_values(base), (std::vector<double>{0,  1,  2,  3,  4,  5,  6,  -1, -1, -1,
                                                   10, 11, -1, -1, -1, 15, 16, 17, 18, 19}));
  EXPECT_TRUE(base.narrow(0, 1, 2).is_contiguous());
  EXPECT_EQ(base.narrow(1, 5, 0).numel(), 0);
}

TEST(Tensor, NarrowOutOfRangeNamesTheValues) {
  const Tensor base({4, 5}, DType::f32);
  try {
    base.narrow(1, 3, 3);
    FAIL();
  } catch (const InvalidArgument& error) {
    EXPECT_NE(std::string(error.what()).find("narrow(dim=1, start=3, length=3)"),
              std::string::npos);
  }
  EXPECT_THROW(base.narrow(2, 0, 1), InvalidArgument);
  EXPECT_THROW(base.narrow(0, -1, 1), InvalidArgument);
}

TEST(Tensor, CopyBetweenViewsMovesExactlyTheViewedElements) {
  Tensor source = Tensor::arange({3, 4}, DType::i64);
  Tensor target = Tensor::full({5, 6}, DType::i64, -7);
  target.narrow(0, 2, 3).narrow(1, 1, 2).copy_from(source.narrow(1, 2, 2));
  const std::vector<double> values = all_values(target);
  for (std::int64_t r = 0; r < 5; ++r) {
    for (std::int64_t c = 0; c < 6; ++c) {
      const double expected =
          (r >= 2 && c >= 1 && c < 3) ? static_cast<double>((r - 2) * 4 + 2 + (c - 1)) : -7;
      EXPECT_EQ(values[static_cast<std::size_t>(r * 6 + c)], expected) << r << "," << c;
    }
  }
  EXPECT_THROW(target.copy_from(source), InvalidArgument);
  EXPECT_THROW(target.narrow(0, 0, 3).narrow(1, 0, 4).copy_from(Tensor({3, 4}, DType::f32)),
               InvalidArgument);
}

TEST(Tensor, CopyBetweenOverlappingViewsOfOneBufferReadsTheOldValues) {
  Tensor base = Tensor::arange({10}, DType::f64);
  base.narrow(0, 2, 6).copy_from(base.narrow(0, 0, 6));
  EXPECT_EQ(all_values(base), (std::vector<double>{0, 1, 0, 1, 2, 3, 4, 5, 8, 9}));
}

TEST(Tensor, CloneIsDeep) {
  Tensor base = Tensor::arange({3}, DType::u8);
  Tensor copy = base.clone();
  base.fill(9);
  EXPECT_EQ(all_values(copy), (std::vector<double>{0, 1, 2}));
}

TEST(Tensor, GetAndSetCheckTheIndex) {
  Tensor tensor({2, 3}, DType::f32);
  const std::int64_t at[] = {1, 2};
  tensor.set(at, 4.5);
  EXPECT_EQ(tensor.get(at), 4.5);
  const std::int64_t outside[] = {2, 0};
  EXPECT_THROW(tensor.get(outside), InvalidArgument);
  const std::int64_t short_index[] = {1};
  EXPECT_THROW(tensor.set(short_index, 1), InvalidArgument);
}

TEST(Tensor, TypedAccessChecksDTypeAndContiguity) {
  Tensor tensor = Tensor::arange({2, 3}, DType::f32);
  EXPECT_EQ(tensor.values<float>()[4], 4.0f);
  EXPECT_THROW(tensor.values<double>(), InvalidArgument);
  EXPECT_THROW(tensor.narrow(1, 0, 2).values<float>(), InvalidArgument);
  EXPECT_THROW(Tensor().bytes(), InvalidArgument);
}

TEST(Tensor, DigestDependsOnContentShapeAndDTypeNotOnLayout) {
  Tensor base = Tensor::random_normal({6, 7}, DType::f32, 3);
  const Tensor view = base.narrow(1, 2, 4);
  EXPECT_EQ(view.digest(), view.clone().digest());
  EXPECT_NE(view.digest(), base.narrow(1, 1, 4).digest());
  const Tensor a = Tensor::zeros({2, 3}, DType::f32);
  EXPECT_NE(a.digest(), Tensor::zeros({3, 2}, DType::f32).digest());
  EXPECT_NE(a.digest(), Tensor::zeros({2, 3}, DType::i32).digest());
  Tensor negative_zero = Tensor::full({2, 3}, DType::f32, -0.0);
  EXPECT_NE(a.digest(), negative_zero.digest()) << "digests compare bits";
  EXPECT_FALSE(a.bitwise_equal(negative_zero));
  EXPECT_TRUE(view.bitwise_equal(view.clone()));
}

TEST(Tensor, RandomNormalDependsOnSeedAndIndexOnly) {
  const Tensor big = Tensor::random_normal({1000}, DType::f64, 42);
  const Tensor small = Tensor::random_normal({10}, DType::f64, 42);
  EXPECT_TRUE(big.narrow(0, 0, 10).bitwise_equal(small));
  EXPECT_FALSE(Tensor::random_normal({10}, DType::f64, 43).bitwise_equal(small));
  // Narrower dtypes are the f64 samples rounded once.
  const Tensor bf = Tensor::random_normal({1000}, DType::bf16, 42);
  for (std::int64_t i = 0; i < 1000; ++i) {
    const std::int64_t at[] = {i};
    ASSERT_EQ(bf.values<BFloat16>()[static_cast<std::size_t>(i)], to_bfloat16(big.get(at)));
  }
}

}  // namespace
}  // namespace meshtensor
