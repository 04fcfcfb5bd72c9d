#pragma once

#include <meshtensor/dtensor/dtensor.hpp>
#include <meshtensor/dtensor/sharding.hpp>

namespace meshtensor::tp {

using dtensor::DTensor;
using dtensor::MatmulForm;
using dtensor::RedistributeOptions;

// Compute ops on DTensors. Each is collective (every rank of the mesh calls it with the same
// arguments) and runs in three steps: sharding propagation picks the cheapest of the op's
// strategies (select_strategy, priced with the planner's cost model), the inputs are moved to that
// strategy's placements with the planner's plans, and the op runs on the local blocks, giving
// the strategy's output placement (e.g. a contraction sharded in both inputs gives
// Partial(sum)). An active CommDebugMode records the strategy and the collectives. f32 tensors
// (matmul also f64); `options` sets the reduction mode of every collective.

/// matmul of one of the three training forms (see MatmulForm).
DTensor matmul(const DTensor& a, const DTensor& b, MatmulForm form = MatmulForm::nn,
               const RedistributeOptions& options = {});
/// a + b, b's shape equal to a's or to a suffix of it (a bias).
DTensor add(const DTensor& a, const DTensor& b, const RedistributeOptions& options = {});
/// x · factor.
DTensor scale(const DTensor& x, double factor, const RedistributeOptions& options = {});
/// GELU (tanh form, kernels::gelu_forward).
DTensor gelu(const DTensor& x, const RedistributeOptions& options = {});
/// Layer norm over the last dim with weight and bias of that dim (row statistics in f64).
DTensor layer_norm(const DTensor& x, const DTensor& weight, const DTensor& bias,
                   double epsilon = 1e-5, const RedistributeOptions& options = {});
/// Softmax over the last dim (f64 sums in ascending order).
DTensor softmax(const DTensor& x, const RedistributeOptions& options = {});
/// Causal attention, head by head, of q, k, v [batch, heads, sequence, head_dim] (scale 1/sqrt
/// of the head dim; kernels::attention_row).
DTensor attention(const DTensor& q, const DTensor& k, const DTensor& v,
                  const RedistributeOptions& options = {});
/// Rows of `table` [rows, dim] at `ids` (i32 [...]): [..., dim]. InvalidArgument naming an id
/// outside [0, rows).
DTensor embedding(const DTensor& table, const DTensor& ids,
                  const RedistributeOptions& options = {});
/// Mean softmax cross-entropy (f64 scalar) of `logits` [rows, classes] against `labels` (i32
/// [rows]). With the classes sharded it is the vocabulary-parallel loss: the row maxima, the
/// exponential sums (exact in exact mode) and the target logits are reduced over the class
/// shards, and no rank gathers the logits.
DTensor cross_entropy(const DTensor& logits, const DTensor& labels,
                      const RedistributeOptions& options = {});

}  // namespace meshtensor::tp
