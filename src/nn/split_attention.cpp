#include "split_attention.hpp"

#include <algorithm>

namespace meshtensor::nn {

Tensor column_block(const float* matrix, std::int64_t rows, std::int64_t stride,
                    std::int64_t column, std::int64_t width) {
  Tensor out = Tensor::uninitialized(Shape{rows, width}, DType::f32);
  float* o = out.values<float>().data();
  for (std::int64_t r = 0; r < rows; ++r)
    std::copy_n(matrix + r * stride + column, width, o + r * width);
  return out;
}

namespace {

/// out[d, i] = from[i, d] for `rows` rows of `cols` columns (row stride `stride`), out's row
/// stride `rows`: in 16 x 16 blocks, so that the reads of a block stay in cache and each of its
/// writes fills a cache line.
void transpose_block(const float* from, std::int64_t stride, std::int64_t rows, std::int64_t cols,
                     float* out) {
  constexpr std::int64_t kBlock = 16;
  for (std::int64_t i0 = 0; i0 < rows; i0 += kBlock) {
    const std::int64_t ni = std::min(kBlock, rows - i0);
    for (std::int64_t d0 = 0; d0 < cols; d0 += kBlock) {
      const std::int64_t nd = std::min(kBlock, cols - d0);
      for (std::int64_t d = d0; d < d0 + nd; ++d)
        for (std::int64_t i = i0; i < i0 + ni; ++i)
          out[d * rows + i] = from[i * stride + d];
    }
  }
}

}  // namespace

void HeadOperands::copy(const float* matrix, std::int64_t stride, std::int64_t column,
                        std::int64_t length, std::int64_t width, bool transpose,
                        std::vector<float>& out) {
  out.resize(static_cast<std::size_t>(length * width));
  if (transpose) {
    transpose_block(matrix + column, stride, length, width, out.data());
    return;
  }
  for (std::int64_t i = 0; i < length; ++i)
    std::copy_n(matrix + i * stride + column, width, out.data() + i * width);
}

kernels::HeadGradientInputs HeadOperands::inputs(const kernels::RowStats* stats,
                                                 std::int64_t length, std::int64_t head_dim,
                                                 float scale) const {
  kernels::HeadGradientInputs in;
  in.queries = queries.data();
  in.keys = keys.data();
  in.keys_t = keys_t.data();
  in.values_t = values_t.data();
  in.stats = stats;
  in.grad_output = grad_output.data();
  in.length = length;
  in.head_dim = head_dim;
  in.scale = scale;
  return in;
}

WholeQuerySide gather_query_side(SequenceSplit& split, const Tensor& queries,
                                 const Tensor& grad_output, const Tensor& stats,
                                 const Tensor& weighted, std::int64_t heads) {
  const std::int64_t batch = queries.shape()[0];
  const std::int64_t rows = queries.shape()[1];
  const std::int64_t width = queries.shape()[2];  // heads * head_dim
  const std::int64_t packed = 2 * width + 3 * heads;
  // Row r of sequence b: its queries, output gradients, then per head largest, total, Σ p dP.
  Tensor local = Tensor::uninitialized(Shape{batch, rows, packed}, DType::f32);
  const float* q = queries.values<float>().data();
  const float* d = grad_output.values<float>().data();
  const float* s = stats.values<float>().data();
  const float* w = weighted.values<float>().data();
  float* out = local.values<float>().data();
  for (std::int64_t b = 0; b < batch; ++b) {
    for (std::int64_t r = 0; r < rows; ++r) {
      float* row = out + (b * rows + r) * packed;
      std::copy_n(q + (b * rows + r) * width, width, row);
      std::copy_n(d + (b * rows + r) * width, width, row + width);
      for (std::int64_t h = 0; h < heads; ++h) {
        const std::int64_t at = (b * heads + h) * rows + r;
        row[2 * width + 3 * h] = s[2 * at];
        row[2 * width + 3 * h + 1] = s[2 * at + 1];
        row[2 * width + 3 * h + 2] = w[at];
      }
    }
  }
  const Tensor all = split.gather(local);
  const std::int64_t length = all.shape()[1];
  WholeQuerySide whole{Tensor::uninitialized(Shape{batch, length, width}, DType::f32),
                       Tensor::uninitialized(Shape{batch, length, width}, DType::f32),
                       Tensor::uninitialized(Shape{batch, heads, length, 2}, DType::f32),
                       Tensor::uninitialized(Shape{batch, heads, length}, DType::f32)};
  const float* in = all.values<float>().data();
  float* wq = whole.queries.values<float>().data();
  float* wd = whole.grad_output.values<float>().data();
  float* ws = whole.stats.values<float>().data();
  float* ww = whole.weighted.values<float>().data();
  for (std::int64_t b = 0; b < batch; ++b) {
    for (std::int64_t t = 0; t < length; ++t) {
      const float* row = in + (b * length + t) * packed;
      std::copy_n(row, width, wq + (b * length + t) * width);
      std::copy_n(row + width, width, wd + (b * length + t) * width);
      for (std::int64_t h = 0; h < heads; ++h) {
        const std::int64_t at = (b * heads + h) * length + t;
        ws[2 * at] = row[2 * width + 3 * h];
        ws[2 * at + 1] = row[2 * width + 3 * h + 1];
        ww[at] = row[2 * width + 3 * h + 2];
      }
    }
  }
  return whole;
}

void split_key_backward(const SequenceSplit& split, const WholeQuerySide& whole, std::int64_t b,
                        std::int64_t head, std::int64_t heads, std::int64_t head_dim,
                        const std::vector<float>& keys_t, const std::vector<float>& values_t,
                        float scale, float* grad_keys, float* grad_values) {
  const std::int64_t length = whole.queries.shape()[1];
  const std::int64_t width = heads * head_dim;
  std::vector<float> queries;
  std::vector<float> grad_output;
  const std::int64_t first_row = b * length * width;
  HeadOperands::copy(whole.queries.values<float>().data() + first_row, width, head * head_dim,
                     length, head_dim, false, queries);
  HeadOperands::copy(whole.grad_output.values<float>().data() + first_row, width, head * head_dim,
                     length, head_dim, false, grad_output);
  kernels::HeadGradientInputs in;
  in.queries = queries.data();
  in.keys_t = keys_t.data();
  in.values_t = values_t.data();
  in.stats = reinterpret_cast<const kernels::RowStats*>(whole.stats.values<float>().data()) +
             (b * heads + head) * length;
  in.weighted = whole.weighted.values<float>().data() + (b * heads + head) * length;
  in.grad_output = grad_output.data();
  in.length = length;
  in.head_dim = head_dim;
  in.scale = scale;
  std::int64_t row = 0;
  for (const auto& [first, count] : split.pieces()) {
    kernels::attention_key_backward(in, first, count, grad_keys + row * head_dim,
                                    grad_values + row * head_dim);
    row += count;
  }
}

}  // namespace meshtensor::nn
