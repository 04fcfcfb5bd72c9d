#include <cstring>
#include <limits>
#include <vector>

#include <gtest/gtest.h>

#include <meshtensor/core/tensor.hpp>
#include <meshtensor/kernels/elementwise.hpp>
#include <meshtensor/kernels/reduce.hpp>
#include <meshtensor/kernels/simd.hpp>

namespace meshtensor::kernels {
namespace {

std::vector<Tensor> random_inputs(DType dtype, int k, std::int64_t count, std::uint64_t seed) {
  std::vector<Tensor> inputs;
  for (int j = 0; j < k; ++j) {
    inputs.push_back(
        is_floating(dtype)
            ? Tensor::random_normal({count}, dtype, seed + static_cast<std::uint64_t>(j))
            : Tensor::random_int({count}, dtype, seed + static_cast<std::uint64_t>(j), 0, 200));
  }
  return inputs;
}

Tensor reduce_all(DType dtype, ReduceOp op, const std::vector<Tensor>& inputs, std::size_t begin,
                  std::size_t count, Tensor out) {
  const std::size_t element = dtype_size(dtype);
  std::vector<const std::byte*> pointers;
  for (const Tensor& input : inputs)
    pointers.push_back(input.bytes().data() + begin * element);
  std::byte* target = out.bytes().data() + begin * element;
  reduce_ordered(dtype, op, pointers, std::span<std::byte* const>(&target, 1), count);
  return out;
}

// Reference: the documented left-to-right order, one element at a time (f32 accumulator for f32
// and the halves, f64 otherwise; integer inputs are small, so f64 is exact for them).
double reference_element(DType dtype, ReduceOp op, const std::vector<Tensor>& inputs,
                         std::int64_t i) {
  const std::int64_t at[] = {i};
  if (dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f16) {
    float acc = static_cast<float>(inputs[0].get(at));
    for (std::size_t j = 1; j < inputs.size(); ++j) {
      const auto v = static_cast<float>(inputs[j].get(at));
      acc = (op == ReduceOp::max)   ? std::max(acc, v)
            : (op == ReduceOp::min) ? std::min(acc, v)
                                    : acc + v;
    }
    if (op == ReduceOp::avg) {
      return dtype == DType::f32 ? static_cast<double>(acc / static_cast<float>(inputs.size()))
                                 : static_cast<double>(acc) / static_cast<double>(inputs.size());
    }
    return acc;
  }
  double acc = inputs[0].get(at);
  for (std::size_t j = 1; j < inputs.size(); ++j) {
    const double v = inputs[j].get(at);
    acc = (op == ReduceOp::max)   ? std::max(acc, v)
          : (op == ReduceOp::min) ? std::min(acc, v)
                                  : acc + v;
  }
  return op == ReduceOp::avg ? acc / static_cast<double>(inputs.size()) : acc;
}

TEST(ReduceOrdered, MatchesLeftToRightReference) {
  for (DType dtype : {DType::f64, DType::f32, DType::bf16, DType::f16, DType::i64, DType::i32}) {
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min}) {
      for (int k : {1, 2, 3, 8}) {
        const std::int64_t count = 2500;
        const auto inputs = random_inputs(dtype, k, count, 11);
        const Tensor out = reduce_all(dtype, op, inputs, 0, count, Tensor({count}, dtype));
        for (std::int64_t i = 0; i < count; ++i) {
          // The reference value rounded to the dtype, compared bit for bit.
          const Tensor expected = Tensor::full({1}, dtype, reference_element(dtype, op, inputs, i));
          ASSERT_TRUE(out.narrow(0, i, 1).bitwise_equal(expected))
              << dtype_name(dtype) << " " << reduce_op_name(op) << " k=" << k << " i=" << i;
        }
      }
    }
  }
}

TEST(ReduceOrdered, ChunkingDoesNotChangeBits) {
  for (DType dtype : {DType::f32, DType::bf16, DType::f64}) {
    const std::int64_t count = 5000;
    const auto inputs = random_inputs(dtype, 7, count, 3);
    const Tensor whole = reduce_all(dtype, ReduceOp::sum, inputs, 0, count, Tensor({count}, dtype));
    Tensor pieces({count}, dtype);
    for (std::size_t begin = 0; begin < static_cast<std::size_t>(count); begin += 333) {
      reduce_all(dtype, ReduceOp::sum, inputs, begin, std::min<std::size_t>(333, count - begin),
                 pieces);
    }
    EXPECT_TRUE(whole.bitwise_equal(pieces)) << dtype_name(dtype);
  }
}

TEST(ReduceOrdered, OutputMayBeAnInputsOwnBufferAndFansOutToAll) {
  const std::int64_t count = 3000;
  auto inputs = random_inputs(DType::f32, 4, count, 5);
  const Tensor expected =
      reduce_all(DType::f32, ReduceOp::sum, inputs, 0, count, Tensor({count}, DType::f32));
  std::vector<const std::byte*> pointers;
  std::vector<std::byte*> outputs;
  for (Tensor& input : inputs) {
    pointers.push_back(input.bytes().data());
    outputs.push_back(input.bytes().data());
  }
  reduce_ordered(DType::f32, ReduceOp::sum, pointers, outputs, static_cast<std::size_t>(count));
  for (const Tensor& input : inputs)
    EXPECT_TRUE(input.bitwise_equal(expected));
}

// Two inputs into one output take a single-pass kernel, also when the output is either input's
// own buffer: the same bits as the documented left-to-right reference.
TEST(ReduceOrdered, TwoInputsIntoEitherInputsOwnBufferFollowTheReference) {
  for (const DType dtype : {DType::f32, DType::f64}) {
    for (const ReduceOp op : {ReduceOp::sum, ReduceOp::avg}) {
      const std::int64_t count = 3001;
      const auto inputs = random_inputs(dtype, 2, count, 31);
      Tensor expected({count}, dtype);
      for (std::int64_t i = 0; i < count; ++i) {
        const std::int64_t at[] = {i};
        expected.set(at, reference_element(dtype, op, inputs, i));
      }
      for (const int target : {0, 1, 2}) {  // input 0's buffer, input 1's, a separate one
        std::vector<Tensor> copies = {inputs[0].clone(), inputs[1].clone()};
        Tensor separate({count}, dtype);
        Tensor& out = target < 2 ? copies[static_cast<std::size_t>(target)] : separate;
        const std::byte* pointers[] = {copies[0].bytes().data(), copies[1].bytes().data()};
        std::byte* const output = out.bytes().data();
        reduce_ordered(dtype, op, pointers, std::span<std::byte* const>(&output, 1),
                       static_cast<std::size_t>(count));
        EXPECT_TRUE(out.bitwise_equal(expected))
            << dtype_name(dtype) << " " << reduce_op_name(op) << " output " << target;
      }
    }
  }
}

// The ordered kernels are compiled for each SIMD level: the same bits on every one.
TEST(ReduceOrdered, EverySimdLevelGivesTheSameBits) {
  const SimdLevel saved = simd_level();
  for (const DType dtype : {DType::f64, DType::f32, DType::bf16, DType::i32}) {
    for (const int k : {1, 2, 3, 5, 6, 7, 8, 13}) {
      const std::int64_t count = 2 * 1024 + 61;
      const auto inputs = random_inputs(dtype, k, count, 23);
      for (const ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max}) {
        set_simd_level(SimdLevel::baseline);
        const Tensor expected = reduce_all(dtype, op, inputs, 0, count, Tensor({count}, dtype));
        for (const SimdLevel level : {SimdLevel::avx2, SimdLevel::avx512}) {
          if (static_cast<int>(level) > static_cast<int>(best_simd_level())) continue;
          set_simd_level(level);
          const Tensor got = reduce_all(dtype, op, inputs, 0, count, Tensor({count}, dtype));
          EXPECT_TRUE(got.bitwise_equal(expected))
              << dtype_name(dtype) << " k=" << k << " " << reduce_op_name(op) << " "
              << simd_level_name(level);
        }
      }
    }
  }
  set_simd_level(saved);
}

// NaN addends with different signs and payloads, at every position of buffers of several
// lengths (scalar and vectorised code): a NaN sum or mean is always the canonical NaN.
TEST(ReduceOrdered, NanSumsAreCanonicalWhateverTheBufferLength) {
  const std::uint64_t f64_nans[] = {0x7FF8000000000001ull, 0xFFF8000000000002ull};
  const std::uint32_t f32_nans[] = {0x7FC00001u, 0xFFC00002u};
  const std::uint16_t half_nans[] = {0x7E01u, 0xFE02u};
  const std::uint16_t bf16_nans[] = {0x7FC1u, 0xFFC2u};
  for (const DType dtype : {DType::f64, DType::f32, DType::f16, DType::bf16}) {
    const std::size_t element = dtype_size(dtype);
    const Tensor canonical = Tensor::full({1}, dtype, std::numeric_limits<double>::quiet_NaN());
    for (const std::int64_t count : {1, 2, 7, 8, 33, 1500}) {
      for (const ReduceOp op : {ReduceOp::sum, ReduceOp::avg}) {
        std::vector<Tensor> inputs = random_inputs(dtype, 2, count, 11);
        const std::int64_t at = count / 2;
        for (int j = 0; j < 2; ++j) {
          std::byte* to = inputs[static_cast<std::size_t>(j)].bytes().data() +
                          static_cast<std::size_t>(at) * element;
          const auto k = static_cast<std::size_t>(j);
          if (dtype == DType::f64) std::memcpy(to, &f64_nans[k], element);
          if (dtype == DType::f32) std::memcpy(to, &f32_nans[k], element);
          if (dtype == DType::f16) std::memcpy(to, &half_nans[k], element);
          if (dtype == DType::bf16) std::memcpy(to, &bf16_nans[k], element);
        }
        const Tensor out = reduce_all(dtype, op, inputs, 0, static_cast<std::size_t>(count),
                                      Tensor({count}, dtype));
        EXPECT_TRUE(out.narrow(0, at, 1).bitwise_equal(canonical))
            << dtype_name(dtype) << " count " << count << " " << reduce_op_name(op);
        // The pairwise kernel agrees, in either order.
        for (const bool reversed : {false, true}) {
          Tensor target = inputs[reversed ? 1 : 0].clone();
          accumulate(target, inputs[reversed ? 0 : 1], ReduceOp::sum);
          EXPECT_TRUE(target.narrow(0, at, 1).bitwise_equal(canonical)) << dtype_name(dtype);
        }
      }
    }
  }
}

}  // namespace
}  // namespace meshtensor::kernels
