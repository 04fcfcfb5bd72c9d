#include "matmul_bench.hpp"

#include <algorithm>
#include <string>

#include <fmt/format.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/core/random.hpp>
#include <meshtensor/core/tensor.hpp>
#include <meshtensor/kernels/binned_sum.hpp>
#include <meshtensor/kernels/elementwise.hpp>
#include <meshtensor/kernels/matmul.hpp>
#include <meshtensor/kernels/openblas_baseline.hpp>

#include "timing.hpp"

namespace meshtensor::bench {

namespace {

/// Times `subject` and `baseline` alternately `count` times: their median times and the median
/// of the per-pair ratios baseline / subject (a drift in machine speed cancels within a pair).
struct PairedTimes {
  double subject_s = 0.0;
  double baseline_s = 0.0;
  double baseline_over_subject = 0.0;
};

template <class Subject, class Baseline>
PairedTimes time_pairs(int count, Subject&& subject, Baseline&& baseline) {
  std::vector<double> subject_s, baseline_s, ratios;
  for (int i = 0; i < count; ++i) {
    const double s = time_once(subject);
    const double b = time_once(baseline);
    subject_s.push_back(s);
    baseline_s.push_back(b);
    ratios.push_back(b / s);
  }
  return {median(subject_s), median(baseline_s), median(ratios)};
}

int iterations_for(double seconds_per_call, int requested) {
  if (requested > 0) return requested;
  return std::clamp(static_cast<int>(0.3 / std::max(seconds_per_call, 1e-6)), 5, 200);
}

}  // namespace

std::vector<MatmulShape> default_matmul_shapes() {
  std::vector<MatmulShape> shapes{{512, 512, 512, "x·W"}};
  for (const std::int64_t rows : {128, 256}) {
    for (const auto& [in, out] :
         {std::pair<std::int64_t, std::int64_t>{784, 1024}, {1024, 1024}, {1024, 10}}) {
      shapes.push_back({rows, out, in, "x·W"});
      shapes.push_back({rows, in, out, "dy·Wᵀ"});
      shapes.push_back({in, out, rows, "xᵀ·dy"});
    }
  }
  const std::vector<MatmulShape> gpt = gpt_matmul_shapes();
  shapes.insert(shapes.end(), gpt.begin(), gpt.end());
  return shapes;
}

std::vector<MatmulShape> gpt_matmul_shapes() {
  std::vector<MatmulShape> shapes;
  // The GPTs' (2048 tokens a rank): attention's qkv and projection, the MLP's two layers, at the
  // default GPT's dim 128 and the 25M-parameter model's dim 512 (scripts/bench-scale.sh).
  constexpr std::int64_t kGptRows = 2048;
  for (const std::int64_t dim : {128, 512}) {
    for (const auto& [in, out] : {std::pair<std::int64_t, std::int64_t>{dim, 3 * dim},
                                  {dim, dim},
                                  {dim, 4 * dim},
                                  {4 * dim, dim}}) {
      shapes.push_back({kGptRows, out, in, "x·W"});
      shapes.push_back({kGptRows, in, out, "dy·Wᵀ"});
      shapes.push_back({in, out, kGptRows, "xᵀ·dy"});
    }
  }
  return shapes;
}

std::vector<MatmulBenchRow> run_matmul_bench(const std::vector<MatmulShape>& shapes,
                                             int iterations) {
  std::vector<MatmulBenchRow> rows;
  for (const MatmulShape& shape : shapes) {
    const bool transpose_a = shape.form == "xᵀ·dy";
    const bool transpose_b = shape.form == "dy·Wᵀ";
    const Tensor a = Tensor::random_normal(
        transpose_a ? Shape{shape.k, shape.m} : Shape{shape.m, shape.k}, DType::f32, 1);
    const Tensor b = Tensor::random_normal(
        transpose_b ? Shape{shape.n, shape.k} : Shape{shape.k, shape.n}, DType::f32, 2);
    Tensor c(Shape{shape.m, shape.n}, DType::f32);
    Tensor c_blas(Shape{shape.m, shape.n}, DType::f32);
    const auto ours = [&] {
      kernels::matmul(a, transpose_a ? kernels::Transpose::yes : kernels::Transpose::no, b,
                      transpose_b ? kernels::Transpose::yes : kernels::Transpose::no, c);
    };
    const auto theirs = [&] {
      kernels::openblas_matmul(a, transpose_a ? kernels::Transpose::yes : kernels::Transpose::no, b,
                               transpose_b ? kernels::Transpose::yes : kernels::Transpose::no,
                               c_blas, 0.0f);
    };
    ours();
    theirs();  // warm up both
    const int count = iterations_for(time_once(ours), iterations);
    std::vector<double> ours_s, theirs_s, ratios;
    for (int i = 0; i < count; ++i) {
      const double t_ours = time_once(ours);
      const double t_theirs = time_once(theirs);
      ours_s.push_back(t_ours);
      theirs_s.push_back(t_theirs);
      ratios.push_back(t_theirs / t_ours);
    }
    const double flops = 2.0 * static_cast<double>(shape.m * shape.n * shape.k);
    rows.push_back(
        {shape, flops / median(ours_s) / 1e9, flops / median(theirs_s) / 1e9, median(ratios)});
  }
  return rows;
}

std::vector<Bf16MatmulRow> run_bf16_matmul_bench(const std::vector<MatmulShape>& shapes,
                                                 int iterations) {
  std::vector<Bf16MatmulRow> rows;
  for (const MatmulShape& shape : shapes) {
    const auto ta = shape.form == "xᵀ·dy" ? kernels::Transpose::yes : kernels::Transpose::no;
    const auto tb = shape.form == "dy·Wᵀ" ? kernels::Transpose::yes : kernels::Transpose::no;
    const Tensor a = Tensor::random_normal(
        ta == kernels::Transpose::yes ? Shape{shape.k, shape.m} : Shape{shape.m, shape.k},
        DType::f32, 1);
    const Tensor b = Tensor::random_normal(
        tb == kernels::Transpose::yes ? Shape{shape.n, shape.k} : Shape{shape.k, shape.n},
        DType::f32, 2);
    const Tensor a16 = kernels::convert(a, DType::bf16);
    const Tensor b16 = kernels::convert(b, DType::bf16);
    Tensor c(Shape{shape.m, shape.n}, DType::f32);
    const auto f32 = [&] { kernels::matmul(a, ta, b, tb, c); };
    const auto bf16 = [&] { kernels::matmul(a16, ta, b16, tb, c); };
    f32();
    bf16();
    const PairedTimes times = time_pairs(iterations_for(time_once(bf16), iterations), bf16, f32);
    const double flops = 2.0 * static_cast<double>(shape.m * shape.n * shape.k);
    rows.push_back({shape, flops / times.subject_s / 1e9, flops / times.baseline_s / 1e9,
                    times.baseline_over_subject});
  }
  return rows;
}

std::vector<ExactGradientRow> run_exact_gradient_bench(double zero_fraction, int iterations) {
  std::vector<ExactGradientRow> rows;
  for (const auto& [in, out] :
       {std::pair<std::int64_t, std::int64_t>{784, 1024}, {1024, 1024}, {1024, 10}}) {
    constexpr std::int64_t kRows = 128;
    Tensor x = Tensor::random_normal(Shape{kRows, in}, DType::f32, 3);
    auto values = x.values<float>();
    for (std::size_t i = 0; i < values.size(); ++i) {
      const auto draw = static_cast<double>(uniform_int_sample(4, i, 0, 999)) / 1000.0;
      if (draw < zero_fraction) values[i] = 0.0f;
    }
    const Tensor dy = Tensor::random_normal(Shape{kRows, out}, DType::f32, 5);
    Tensor dense(Shape{in, out}, DType::f32);
    kernels::BinnedSums sums(in * out);
    const auto ordered = [&] {
      kernels::matmul(x, kernels::Transpose::yes, dy, kernels::Transpose::no, dense);
    };
    const auto exact = [&] {
      sums.clear();
      kernels::add_outer_products(sums, 0, x, dy);
    };
    ordered();
    exact();
    // Here the ratio is exact over ordered time: the baseline is the exact gradient.
    const PairedTimes times =
        time_pairs(iterations_for(time_once(exact), iterations), ordered, exact);
    rows.push_back({{in, out, kRows, "xᵀ·dy"},
                    times.baseline_s,
                    times.subject_s,
                    times.baseline_over_subject});
  }
  return rows;
}

}  // namespace meshtensor::bench
