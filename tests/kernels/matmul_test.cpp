#include <cmath>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/kernels/matmul.hpp>
#include <meshtensor/kernels/simd.hpp>

namespace meshtensor::kernels {
namespace {

using T = Transpose;

Tensor random(std::int64_t rows, std::int64_t cols, DType dtype, std::uint64_t seed) {
  return Tensor::random_normal(Shape{rows, cols}, dtype, seed);
}

DType output_dtype(DType input) {
  return input == DType::f64 ? DType::f64 : DType::f32;
}

/// op(a)·op(b) as a fresh tensor.
Tensor product(const Tensor& a, T ta, const Tensor& b, T tb) {
  const std::int64_t m = a.shape()[ta == T::yes ? 1 : 0];
  const std::int64_t n = b.shape()[tb == T::yes ? 0 : 1];
  Tensor c(Shape{m, n}, output_dtype(a.dtype()));
  matmul(a, ta, b, tb, c);
  return c;
}

class SimdLevels : public ::testing::Test {
 protected:
  void TearDown() override { set_simd_level(best_simd_level()); }
  std::vector<SimdLevel> levels() const {
    std::vector<SimdLevel> out;
    for (auto level : {SimdLevel::baseline, SimdLevel::avx2, SimdLevel::avx512})
      if (static_cast<int>(level) <= static_cast<int>(best_simd_level())) out.push_back(level);
    return out;
  }
};

TEST(Matmul, MatchesAnF64ReferenceForEveryForm) {
  for (const DType dtype : {DType::f32, DType::f64, DType::bf16, DType::f16}) {
    const Tensor x = random(9, 300, dtype, 1);    // [m, k]
    const Tensor w = random(300, 37, dtype, 2);   // [k, n]
    const Tensor wt = random(37, 300, dtype, 3);  // [n, k]
    const Tensor xt = random(300, 9, dtype, 4);   // [k, m]
    for (const auto& [a, ta, b, tb] :
         {std::tuple{x, T::no, w, T::no}, std::tuple{x, T::no, wt, T::yes},
          std::tuple{xt, T::yes, w, T::no}}) {
      const Tensor c = product(a, ta, b, tb);
      for (std::int64_t i = 0; i < 9; ++i) {
        for (std::int64_t j = 0; j < 37; ++j) {
          double expected = 0.0;
          double magnitude = 0.0;
          for (std::int64_t k = 0; k < 300; ++k) {
            const std::int64_t ai[2] = {ta == T::yes ? k : i, ta == T::yes ? i : k};
            const std::int64_t bi[2] = {tb == T::yes ? j : k, tb == T::yes ? k : j};
            const double term = a.get(ai) * b.get(bi);
            expected += term;
            magnitude += std::fabs(term);
          }
          const std::int64_t ci[2] = {i, j};
          const double tolerance = magnitude * (dtype == DType::f64 ? 1e-13 : 1e-5);
          ASSERT_NEAR(c.get(ci), expected, tolerance) << dtype_name(dtype) << " " << i << "," << j;
        }
      }
    }
  }
}

TEST(Matmul, ARowsBitsDoNotDependOnTheBatch) {
  // Row r of x·W, dy·Wᵀ computed alone, and at every position of batches of 1, 7 and 256 rows;
  // 10 outputs take the one-vector tiles that read full panels of x in place; batches of up to
  // 16 rows read x and W in place (300 outputs: in tiles several vectors wide), larger ones pack
  // them.
  for (const auto& [dtype, width] :
       {std::pair{DType::f32, 70}, std::pair{DType::f64, 70}, std::pair{DType::bf16, 70},
        std::pair{DType::f32, 10}, std::pair{DType::f64, 10}, std::pair{DType::f32, 300},
        std::pair{DType::f64, 300}}) {
    const Tensor w = random(200, width, dtype, 5);
    const Tensor big = random(256, 200, dtype, 6);
    const Tensor big_dy = random(256, width, dtype, 7);
    const Tensor row = big.narrow(0, 100, 1).contiguous();
    const Tensor dy_row = big_dy.narrow(0, 100, 1).contiguous();
    const Tensor alone = product(row, T::no, w, T::no);
    const Tensor alone_back = product(dy_row, T::no, w, T::yes);
    for (const std::int64_t batch : {1, 7, 16, 17, 256}) {
      for (std::int64_t position = 0; position < batch; ++position) {
        // A batch of other rows with the row at `position`.
        Tensor x = random(batch, 200, dtype, 100 + static_cast<std::uint64_t>(batch));
        Tensor dy = random(batch, width, dtype, 200 + static_cast<std::uint64_t>(batch));
        x.narrow(0, position, 1).copy_from(row);
        dy.narrow(0, position, 1).copy_from(dy_row);
        const Tensor out = product(x, T::no, w, T::no);
        const Tensor back = product(dy, T::no, w, T::yes);
        ASSERT_TRUE(out.narrow(0, position, 1).contiguous().bitwise_equal(alone))
            << dtype_name(dtype) << " width " << width << " batch " << batch << " position "
            << position;
        ASSERT_TRUE(back.narrow(0, position, 1).contiguous().bitwise_equal(alone_back))
            << dtype_name(dtype) << " batch " << batch << " position " << position;
      }
    }
  }
}

TEST(Matmul, WeightGradientRowsDoNotDependOnTheOtherFeatures) {
  // Row i of xᵀ·dy is column i of x against dy: the same bits whatever sits beside column i.
  const Tensor x = random(64, 50, DType::f32, 8);
  const Tensor dy = random(64, 33, DType::f32, 9);
  const Tensor full = product(x, T::yes, dy, T::no);
  for (std::int64_t i = 0; i < 50; i += 7) {
    const Tensor column = x.narrow(1, i, 1).contiguous();
    const Tensor alone = product(column, T::yes, dy, T::no);
    ASSERT_TRUE(full.narrow(0, i, 1).contiguous().bitwise_equal(alone)) << i;
  }
}

TEST_F(SimdLevels, EveryLevelGivesTheSameBits) {
  for (const DType dtype : {DType::f32, DType::f64, DType::bf16, DType::f16}) {
    for (const auto& [m, n, k] : {std::tuple{13, 37, 300}, std::tuple{1, 1, 1},
                                  std::tuple{30, 10, 520}, std::tuple{97, 129, 17}}) {
      const Tensor x = random(m, k, dtype, 11);
      const Tensor w = random(k, n, dtype, 12);
      const Tensor wt = random(n, k, dtype, 13);
      const Tensor xt = random(k, m, dtype, 14);
      std::vector<Tensor> results;
      for (const SimdLevel level : levels()) {
        set_simd_level(level);
        Tensor accumulated = Tensor::random_normal(Shape{m, n}, output_dtype(dtype), 15);
        matmul(x, T::no, w, T::no, accumulated, /*accumulate=*/true);
        results.push_back(product(x, T::no, w, T::no));
        results.push_back(product(x, T::no, wt, T::yes));
        results.push_back(product(xt, T::yes, w, T::no));
        results.push_back(accumulated);
      }
      for (std::size_t r = 4; r < results.size(); ++r)
        ASSERT_TRUE(results[r].bitwise_equal(results[r % 4]))
            << dtype_name(dtype) << " " << m << "x" << n << "x" << k << " level " << r / 4;
    }
  }
}

TEST(Matmul, AccumulateContinuesTheChainFromTheOutput) {
  const Tensor x = random(5, 40, DType::f32, 20);
  const Tensor w = random(40, 6, DType::f32, 21);
  // Summing k in two halves with accumulate gives the same bits as one pass.
  Tensor split(Shape{5, 6}, DType::f32);
  matmul(x.narrow(1, 0, 20).contiguous(), T::no, w.narrow(0, 0, 20).contiguous(), T::no, split);
  matmul(x.narrow(1, 20, 20).contiguous(), T::no, w.narrow(0, 20, 20).contiguous(), T::no, split,
         /*accumulate=*/true);
  EXPECT_TRUE(split.bitwise_equal(product(x, T::no, w, T::no)));
}

TEST_F(SimdLevels, ShortProductsWithATransposedTableHaveTheBitsOfACopy) {
  // A tied head reads its table [n, k] transposed in place: short products (decode's rows)
  // take their own path, which must give the bits of the product with a transposed copy, with
  // partial blocks of 16 columns and of 16 k, from +0, a bias or the output.
  for (const auto& [m, n, k] :
       {std::tuple{1, 100, 70}, std::tuple{3, 16, 16}, std::tuple{4, 17, 15}, std::tuple{7, 33, 1},
        std::tuple{16, 5, 130}}) {
    const Tensor x = random(m, k, DType::f32, 41);
    const Tensor table = random(n, k, DType::f32, 42);
    Tensor copy(Shape{k, n}, DType::f32);
    for (std::int64_t j = 0; j < n; ++j)
      for (std::int64_t i = 0; i < k; ++i)
        copy.values<float>()[static_cast<std::size_t>(i * n + j)] =
            table.values<float>()[static_cast<std::size_t>(j * k + i)];
    const Tensor bias = Tensor::random_normal(Shape{n}, DType::f32, 43);
    const Tensor start = random(m, n, DType::f32, 44);
    for (const SimdLevel level : levels()) {
      set_simd_level(level);
      const std::string where = fmt::format("{}x{}x{} level {}", m, n, k, static_cast<int>(level));
      ASSERT_TRUE(product(x, T::no, table, T::yes).bitwise_equal(product(x, T::no, copy, T::no)))
          << where;
      Tensor biased(Shape{m, n}, DType::f32);
      Tensor expected(Shape{m, n}, DType::f32);
      matmul_bias(x, T::no, table, T::yes, bias, biased);
      matmul_bias(x, T::no, copy, T::no, bias, expected);
      ASSERT_TRUE(biased.bitwise_equal(expected)) << where << " bias";
      Tensor accumulated = start.clone();
      expected = start.clone();
      matmul(x, T::no, table, T::yes, accumulated, /*accumulate=*/true);
      matmul(x, T::no, copy, T::no, expected, /*accumulate=*/true);
      ASSERT_TRUE(accumulated.bitwise_equal(expected)) << where << " accumulate";
    }
  }
}

TEST_F(SimdLevels, BiasStartsEveryChainAsAFilledAccumulatingOutputDoes) {
  // Shapes through every path: short products read in place (m <= 16), edge tiles, several
  // blocks of k, outputs one vector wide, k = 0.
  for (const DType dtype : {DType::f32, DType::f64, DType::bf16}) {
    for (const auto& [m, n, k] :
         {std::tuple{3, 70, 33}, std::tuple{16, 32, 8}, std::tuple{45, 129, 300},
          std::tuple{200, 16, 64}, std::tuple{9, 5, 0}}) {
      const Tensor x = random(m, k, dtype, 31);
      const Tensor w = random(k, n, dtype, 32);
      const Tensor wt = random(n, k, dtype, 33);
      const Tensor bias = Tensor::random_normal(Shape{n}, output_dtype(dtype), 34);
      for (const SimdLevel level : levels()) {
        set_simd_level(level);
        for (const bool transposed : {false, true}) {
          const Tensor& b = transposed ? wt : w;
          const T tb = transposed ? T::yes : T::no;
          Tensor filled(Shape{m, n}, output_dtype(dtype));
          for (std::int64_t r = 0; r < m; ++r)
            filled.narrow(0, r, 1).copy_from(bias.reshape(Shape{1, n}));
          matmul(x, T::no, b, tb, filled, /*accumulate=*/true);
          Tensor started(Shape{m, n}, output_dtype(dtype));
          matmul_bias(x, T::no, b, tb, bias, started);
          ASSERT_TRUE(started.bitwise_equal(filled))
              << dtype_name(dtype) << " " << m << "x" << n << "x" << k << " level "
              << static_cast<int>(level) << (transposed ? " b transposed" : "");
        }
      }
    }
  }
}

TEST(Matmul, RejectsABiasOfTheWrongShapeOrDtype) {
  const Tensor x = random(3, 5, DType::f32, 1);
  const Tensor w = random(5, 4, DType::f32, 2);
  Tensor c(Shape{3, 4}, DType::f32);
  for (const Tensor& bias : {Tensor(Shape{5}, DType::f32), Tensor(Shape{4}, DType::f64),
                             Tensor(Shape{1, 4}, DType::f32), Tensor()}) {
    try {
      matmul_bias(x, T::no, w, T::no, bias, c);
      FAIL() << "accepted a bias of " << bias.shape().to_string();
    } catch (const InvalidArgument& error) {
      EXPECT_NE(std::string(error.what()).find("bias"), std::string::npos) << error.what();
    }
  }
}

TEST(Matmul, RejectsShapesThatDoNotFit) {
  Tensor c(Shape{3, 4}, DType::f32);
  EXPECT_THROW(matmul(random(3, 5, DType::f32, 1), T::no, random(6, 4, DType::f32, 2), T::no, c),
               InvalidArgument);
  EXPECT_THROW(matmul(random(3, 5, DType::f32, 1), T::no, random(5, 4, DType::f64, 2), T::no, c),
               InvalidArgument);
  Tensor wrong(Shape{3, 4}, DType::f64);
  EXPECT_THROW(
      matmul(random(3, 5, DType::f32, 1), T::no, random(5, 4, DType::f32, 2), T::no, wrong),
      InvalidArgument);
}

}  // namespace
}  // namespace meshtensor::kernels
