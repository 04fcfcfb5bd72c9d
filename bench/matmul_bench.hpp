#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <meshtensor/nn/layers.hpp>

namespace meshtensor::bench {

/// One matmul shape: op(a) is [m, k], op(b) [k, n].
struct MatmulShape {
  std::int64_t m = 0;
  std::int64_t n = 0;
  std::int64_t k = 0;
  std::string form;  ///< "x·W", "dy·Wᵀ" or "xᵀ·dy"
};

/// One timed row: meshtensor's batch-invariant matmul and OpenBLAS's sgemm (one thread) on the
/// same data in the same run, interleaved; the ratio is the median of per-pair throughput ratios.
struct MatmulBenchRow {
  MatmulShape shape;
  double gflops = 0.0;           ///< meshtensor, median
  double openblas_gflops = 0.0;  ///< OpenBLAS, median
  double ratio = 0.0;            ///< meshtensor / OpenBLAS throughput
};

/// The shapes of `meshtensor train`'s default model (global batch 256 on 2 ranks, so 128 rows
/// per rank, and 256) and of the default GPT (2048 rows of dim 128) in all three forms, and
/// 512x512x512.
std::vector<MatmulShape> default_matmul_shapes();

/// The default GPT's and the 25M-parameter GPT's shapes (2048 rows of dim 128 and 512), all
/// three forms.
std::vector<MatmulShape> gpt_matmul_shapes();

/// Times every shape `iterations` times (0: about 0.3 s each).
std::vector<MatmulBenchRow> run_matmul_bench(const std::vector<MatmulShape>& shapes,
                                             int iterations);

/// bf16 products (bf16 operands, the bf16 chain) against f32 products of the same shapes, same
/// run, interleaved; the ratio is the median of per-pair ratios (bf16 / f32 throughput). The
/// operands are converted before the timing: a bf16 layer converts each once (docs/training.md).
struct Bf16MatmulRow {
  MatmulShape shape;
  double gflops = 0.0;      ///< bf16, median
  double f32_gflops = 0.0;  ///< f32, median
  double ratio = 0.0;       ///< bf16 / f32 throughput
};

/// Times every shape's bf16 and f32 products `iterations` times (0: about 0.3 s each).
std::vector<Bf16MatmulRow> run_bf16_matmul_bench(const std::vector<MatmulShape>& shapes,
                                                 int iterations);

/// Exact-mode weight gradient (binned xᵀ·dy) against the ordered one (matmul), same data.
struct ExactGradientRow {
  MatmulShape shape;
  double exact_seconds = 0.0;
  double ordered_seconds = 0.0;
  double ratio = 0.0;  ///< exact / ordered time
};

/// Times the exact and ordered weight gradients at the default model's shapes; `zero_fraction`
/// of x is zero, as after a ReLU or on blank pixels.
std::vector<ExactGradientRow> run_exact_gradient_bench(double zero_fraction, int iterations);

}  // namespace meshtensor::bench
