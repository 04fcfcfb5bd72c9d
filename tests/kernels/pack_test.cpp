#include <vector>

#include <gtest/gtest.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/kernels/pack.hpp>

namespace meshtensor::kernels {
namespace {

TEST(Pack, ViewsOfDifferentDTypesRoundTrip) {
  const Tensor a = Tensor::arange({4, 6}, DType::f32).narrow(1, 1, 3);
  const Tensor b = Tensor::random_normal({5}, DType::bf16, 9);
  const Tensor c = Tensor::zeros({0, 3}, DType::i64);
  const std::vector<Tensor> pieces = {a, b, c};
  EXPECT_EQ(packed_size(pieces), 4u * 3 * 4 + 5 * 2);
  std::vector<std::byte> buffer(packed_size(pieces));
  pack(pieces, buffer);

  Tensor base_a = Tensor::full({4, 6}, DType::f32, -1);
  std::vector<Tensor> targets = {base_a.narrow(1, 2, 3), Tensor({5}, DType::bf16),
                                 Tensor({0, 3}, DType::i64)};
  unpack(buffer, targets);
  EXPECT_TRUE(targets[0].bitwise_equal(a));
  EXPECT_TRUE(targets[1].bitwise_equal(b));
  const std::int64_t untouched[] = {0, 1};
  EXPECT_EQ(base_a.get(untouched), -1);
}

TEST(Pack, BufferSizeMismatchIsAnError) {
  const std::vector<Tensor> pieces = {Tensor({3}, DType::f64)};
  std::vector<std::byte> buffer(23);
  EXPECT_THROW(pack(pieces, buffer), InvalidArgument);
  std::vector<Tensor> targets = {Tensor({3}, DType::f64)};
  EXPECT_THROW(unpack(buffer, targets), InvalidArgument);
}

}  // namespace
}  // namespace meshtensor::kernels
