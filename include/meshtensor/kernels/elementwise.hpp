#pragma once

#include <bit>
#include <cstdint>
#include <type_traits>

#include <meshtensor/core/reduce_op.hpp>
#include <meshtensor/core/tensor.hpp>

namespace meshtensor::kernels {

/// Contiguous copy of `source` in `dtype`. Floating targets round once to nearest even (integer
/// sources above 2^53 in magnitude go through f64 first); integer targets round to nearest and
/// saturate, NaN becomes 0.
Tensor convert(const Tensor& source, DType dtype);

/// `source` itself when it has `dtype` already, else convert(source, dtype): an operand in the
/// dtype a computation reads (bf16 compute's operands, f32 views of them).
Tensor as_dtype(const Tensor& source, DType dtype);

/// An f32 copy of an f32 `source` with every value rounded to `dtype` (bf16 or f16) as convert
/// rounds: the bits of convert(convert(source, dtype), f32), in one pass for bf16.
Tensor rounded_values(const Tensor& source, DType dtype);

/// target[i] = op(target[i], addend[i]) for every element, in the dtype's own arithmetic (bf16
/// and f16 through f32, rounded back each time; integers wrap). `avg` adds like `sum`: the
/// caller divides once at the end.
///
/// max and min are exact and order-free: any NaN operand gives the canonical quiet NaN
/// (positive sign, payload 0), and max(-0, +0) = +0, min(-0, +0) = -0 in either order.
void accumulate(Tensor& target, const Tensor& addend, ReduceOp op);

/// tensor[i] = tensor[i] / divisor (floating dtypes: one rounding; integers: rounds to nearest).
void divide(Tensor& tensor, double divisor);

/// sums[j] += rows[0][j] + rows[1][j] + ... for j < n (rows: `count` rows of n f32, row-major),
/// each column one chain of f32 additions in ascending row order, the columns side by side in
/// vectors: the bits of the plain loop (a bias's gradient).
void column_sums_into(float* sums, const float* rows, std::int64_t count, std::int64_t n);

/// sums[j] += a[0][j] * b[0][j] + a[1][j] * b[1][j] + ..., each product rounded before it is
/// added (never fused), in ascending row order: the bits of the plain loop (a norm's weight
/// gradient).
void column_products_into(float* sums, const float* a, const float* b, std::int64_t count,
                          std::int64_t n);

/// The canonical NaN of a floating storage type (positive quiet NaN, payload 0).
template <class T>
T canonical_nan() {
  if constexpr (std::is_same_v<T, double>) {
    return std::bit_cast<double>(std::uint64_t{0x7FF8000000000000});
  } else if constexpr (std::is_same_v<T, float>) {
    return std::bit_cast<float>(std::uint32_t{0x7FC00000});
  } else if constexpr (std::is_same_v<T, Float16>) {
    return Float16{0x7E00};
  } else {
    static_assert(std::is_same_v<T, BFloat16>, "canonical_nan needs a floating storage type");
    return BFloat16{0x7FC0};
  }
}

}  // namespace meshtensor::kernels
