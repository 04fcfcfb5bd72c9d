#pragma once

#include <cstdint>

namespace meshtensor::kernels {

/// Where one attention head's keys and values lie for attention_row: key j is column j of
/// `keys_t` ([head_dim, stride], transposed so the scores of one query vectorise over the keys)
/// and value j is row j of `values` ([stride, head_dim]).
struct HeadCache {
  const float* keys_t = nullptr;
  const float* values = nullptr;
  std::int64_t stride = 0;  ///< keys a row of keys_t holds (at least every `count` below)
  std::int64_t head_dim = 0;
};

/// What backward needs of a row's softmax to recompute its probabilities with the forward's bits:
/// the largest scaled score and the sum of the exponentials (NaN when a score is NaN).
struct RowStats {
  float largest = 0;
  float total = 0;
};

/// One query row of causal attention over keys 0 .. count-1: scores s_j = (q·k_j)·scale, each
/// dot product one chain over the head dims in ascending order; probabilities p_j =
/// exp(s_j - max s) / Σ exp (the sum in ascending j); output o = Σ_j p_j v_j in ascending j. No
/// value depends on anything but the query, the `count` keys and values and `scale`, so a row
/// computed in a batch, alone, or from a cache of keys and values (a generator) has the same bits;
/// every SIMD level gives them. Writes `count` probabilities and `head_dim` outputs, and the
/// row's `stats` when given.
void attention_row(const float* query, const HeadCache& cache, std::int64_t count, float scale,
                   float* probabilities, float* output, RowStats* stats = nullptr);

/// attention_row for `rows` query rows of one head at once, each with attention_row's bits: row r
/// (its query at queries + r·query_stride) attends keys 0 .. positions[r] of `cache`; its
/// `head_dim` outputs go to output + r·output_stride and its stats to stats[r] when given. A
/// tile of rows shares every load of a key and a value, which row by row would be repeated.
void attention_rows(const float* queries, std::int64_t query_stride, const std::int64_t* positions,
                    std::int64_t rows, const HeadCache& cache, float scale, float* output,
                    std::int64_t output_stride, RowStats* stats = nullptr);

/// The operands of attention_backward for one head of one sequence of `length` rows, all
/// contiguous: queries and keys [length, head_dim], keys and values transposed [head_dim,
/// length], each row's RowStats from attention_row [length] and the output gradient
/// [length, head_dim]. Probabilities are recomputed, never stored: a head keeps 2 values a row,
/// not a row of `length`.
struct HeadGradientInputs {
  const float* queries = nullptr;
  const float* keys = nullptr;
  const float* keys_t = nullptr;
  const float* values_t = nullptr;
  const RowStats* stats = nullptr;
  const float* grad_output = nullptr;
  std::int64_t length = 0;
  std::int64_t head_dim = 0;
  float scale = 1.0f;
  /// Each row's Σ_j p_ij dP_ij from attention_query_backward [length] (attention_key_backward
  /// only).
  const float* weighted = nullptr;
};

/// Gradients of the queries, keys and values ([length, head_dim] each, overwritten) of the
/// causal attention attention_row computes, row by row in ascending order: p_ij recomputed from
/// the scores and the row's stats with attention_row's operations (the same bits), dP_ij =
/// dO_i·v_j, dS_ij = p_ij (dP_ij - Σ_j p_ij dP_ij)·scale, dQ_i = Σ_j dS_ij k_j, dK_j = Σ_i dS_ij
/// q_i, dV_j = Σ_i p_ij dO_i. A fixed order that depends on the sequence alone.
void attention_backward(const HeadGradientInputs& in, float* grad_queries, float* grad_keys,
                        float* grad_values);

/// The query side of attention_backward for rows that are part of a longer sequence (context
/// parallelism): row r is position positions[r] of a sequence whose keys and values `in` holds
/// whole (`in.length` positions), with queries, stats and output gradients of the `rows` rows
/// only. Writes each row's query gradient ([rows, head_dim]) and Σ_j p_ij dP_ij ([rows]), every
/// value with the bits attention_backward gives that position.
void attention_query_backward(const HeadGradientInputs& in, const std::int64_t* positions,
                              std::int64_t rows, float* grad_queries, float* weighted);

/// The key side of attention_backward for keys [first, first + count) of a sequence whose
/// queries, stats, output gradients, keys, values and row sums (`in.weighted`, from
/// attention_query_backward) `in` holds whole: the keys' and values' gradients ([count,
/// head_dim] each, overwritten), each a sum over the query rows in ascending order with the bits
/// attention_backward gives them.
void attention_key_backward(const HeadGradientInputs& in, std::int64_t first, std::int64_t count,
                            float* grad_keys, float* grad_values);

}  // namespace meshtensor::kernels
