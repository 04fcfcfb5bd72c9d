#pragma once

// Causal attention over a sequence split by context parallelism (nn::SequenceSplit): the pieces
// both attention modules share (internal header).
#include <cstdint>
#include <vector>

#include <meshtensor/core/tensor.hpp>
#include <meshtensor/kernels/attention.hpp>
#include <meshtensor/nn/module.hpp>

namespace meshtensor::nn {

/// Columns [column, column + width) of each row of a row-major matrix with `stride` columns,
/// `rows` rows from `matrix`, as a new [rows, width] f32 tensor.
Tensor column_block(const float* matrix, std::int64_t rows, std::int64_t stride,
                    std::int64_t column, std::int64_t width);

/// The query side every head's key-side backward needs, of the whole sequence: queries and output
/// gradients [batch, length, heads·head_dim], row stats [batch, heads, length] and each row's
/// Σ p dP [batch, heads, length].
struct WholeQuerySide {
  Tensor queries;
  Tensor grad_output;
  Tensor stats;
  Tensor weighted;
};

/// Gathers this rank's query side (queries and output gradients [batch, rows, heads·head_dim],
/// stats f32 [batch, heads, rows, 2], weighted [batch, heads, rows]) from every member of
/// `split` into the whole sequence's: one collective.
WholeQuerySide gather_query_side(SequenceSplit& split, const Tensor& queries,
                                 const Tensor& grad_output, const Tensor& stats,
                                 const Tensor& weighted, std::int64_t heads);

/// One head's operands in the layout kernels::attention_backward takes: rows [length, head_dim]
/// and transposed [head_dim, length], copied from columns of row-major matrices.
struct HeadOperands {
  std::vector<float> queries, keys, keys_t, values_t, grad_output;
  /// Copies `length` rows of `width` columns from `column` of `matrix` (row stride `stride`)
  /// into `out`, transposed when asked.
  static void copy(const float* matrix, std::int64_t stride, std::int64_t column,
                   std::int64_t length, std::int64_t width, bool transpose,
                   std::vector<float>& out);
  /// The kernels' view of these operands with `stats`, keys of `length` positions.
  kernels::HeadGradientInputs inputs(const kernels::RowStats* stats, std::int64_t length,
                                     std::int64_t head_dim, float scale) const;
};

/// The key side of one head's backward for this rank's keys (the pieces of `split`): dK and dV
/// of its rows [rows, head_dim] from the whole sequence's query side (`whole`, head `head` of
/// sequence `b`) and keys and values (`keys_t`, `values_t` [head_dim, length]).
void split_key_backward(const SequenceSplit& split, const WholeQuerySide& whole, std::int64_t b,
                        std::int64_t head, std::int64_t heads, std::int64_t head_dim,
                        const std::vector<float>& keys_t, const std::vector<float>& values_t,
                        float scale, float* grad_keys, float* grad_values);

}  // namespace meshtensor::nn
