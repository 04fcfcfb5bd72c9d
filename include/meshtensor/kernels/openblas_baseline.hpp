#pragma once

#include <functional>

#include <meshtensor/core/tensor.hpp>
#include <meshtensor/kernels/matmul.hpp>

namespace meshtensor::kernels {

/// The batch-variant baseline the batch-invariant kernels are measured against: OpenBLAS's
/// cblas_sgemm on one thread, loaded with dlopen on first use, so that nothing that does not use
/// it pays for its start-up (its thread pool) or needs it installed. DataError naming the
/// libraries tried when OpenBLAS cannot be loaded.
///
/// c = op(a)·op(b) + beta·c on f32 row-major matrices: a [m, k] ([k, m] when transposed), b
/// [k, n] ([n, k] when transposed), c [m, n], all contiguous.
void openblas_matmul(const Tensor& a, Transpose transpose_a, const Tensor& b, Transpose transpose_b,
                     Tensor& c, float beta);

/// y += x·W by openblas_matmul: the batch-variant form of Linear's product (nn::MatmulOverride),
/// for `serve --batch-variant` and the benchmarks' batch-variant baselines.
std::function<void(const Tensor& x, const Tensor& w, Tensor& y)> openblas_linear_matmul();

}  // namespace meshtensor::kernels
