#pragma once

#include <meshtensor/core/tensor.hpp>

namespace meshtensor::kernels {

/// Whether a matmul operand is used as stored or transposed.
enum class Transpose : bool { no = false, yes = true };

/// c = (accumulate ? c : 0) + op(a) · op(b), with op(a) of shape [m, k] and op(b) of shape
/// [k, n]: the three forms training needs are x·W, dy·Wᵀ (b transposed) and xᵀ·dy (a
/// transposed). a and b are 2-D with the same dtype; f32, bf16 and f16 inputs compute and write
/// f32, f64 inputs f64; c is [m, n]. All three are contiguous.
///
/// Batch-invariant: every element of c is one chain of fused multiply-adds over k in ascending
/// order, starting from c's old value (accumulate) or +0. So a row's bits never depend on the
/// number of rows, the row's position, the blocking, the SIMD level or anything else but the
/// row's own inputs; the AVX-512, AVX2 and baseline paths give identical bits (the baseline path
/// uses the correctly rounded std::fma).
///
/// bf16 inputs follow the chain of the CPUs' bf16 dot-product instruction (vdpbf16ps) instead:
/// k is taken in pairs (padded with a zero), and each pair does acc = FTZ(fma(a[k+1], b[k+1],
/// acc)) then acc = FTZ(fma(a[k], b[k], acc)), FTZ flushing a subnormal to the zero of its sign;
/// subnormal inputs and a subnormal start count as signed zeros. A bf16 product is exact, so
/// each step is one correct rounding. The instruction runs this where the CPU has it and a
/// check at first use finds it gives these bits (bf16_dot_products_used()); the AVX-512F, AVX2
/// and portable emulations give the same bits everywhere else. Batch-invariant as above.
void matmul(const Tensor& a, Transpose transpose_a, const Tensor& b, Transpose transpose_b,
            Tensor c, bool accumulate = false);

/// c = bias + op(a) · op(b), bias a contiguous [n] of c's dtype: every element's chain starts from
/// bias[j], so the bits are those of filling c's rows with the bias and calling matmul with
/// accumulate, without that pass over c (a layer's output, written and read back again).
void matmul_bias(const Tensor& a, Transpose transpose_a, const Tensor& b, Transpose transpose_b,
                 const Tensor& bias, Tensor c);

/// Whether bf16 matmuls run on the CPU's bf16 dot-product instruction (AVX512_BF16 at the
/// avx512 SIMD level, found at first use to give the documented chain's bits) rather than an
/// emulation of it.
bool bf16_dot_products_used();

/// false: bf16 matmuls run the AVX-512F emulation at the avx512 level even where the instruction
/// runs (tests compare the two bit for bit; benchmarks time the emulation a CPU without it runs).
void allow_bf16_dot_products(bool allowed);

}  // namespace meshtensor::kernels
