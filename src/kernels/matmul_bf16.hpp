#pragma once

// The bf16 product behind kernels::matmul (internal header).

#include <cstdint>

namespace meshtensor::kernels::detail {

/// A bf16 operand by bit patterns: logical element (row, col) at data[row·row_stride +
/// col·col_stride].
struct Bf16Operand {
  const std::uint16_t* data = nullptr;
  std::int64_t row_stride = 0;
  std::int64_t col_stride = 0;
};

/// c = op(a)·op(b) ([m, k]·[k, n], f32 c with row stride ldc), each element's chain starting
/// from c (accumulate), from bias[j] (non-null) or from +0, stepping through k in pairs as the
/// bf16 dot-product instruction does (see kernels::matmul).
void gemm_bf16(std::int64_t m, std::int64_t n, std::int64_t k, const Bf16Operand& a,
               const Bf16Operand& b, float* c, std::int64_t ldc, bool accumulate,
               const float* bias);

}  // namespace meshtensor::kernels::detail
