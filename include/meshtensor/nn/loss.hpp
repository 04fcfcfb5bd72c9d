#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include <meshtensor/core/tensor.hpp>

namespace meshtensor::nn {

/// Softmax cross-entropy of each row of logits against its class label, row by row.
struct CrossEntropyResult {
  Tensor losses;             ///< f64 [rows]: -log softmax(logits)[label]
  Tensor grad_logits;        ///< f32 [rows, classes]: softmax - onehot (the gradient of the sum)
  std::int64_t correct = 0;  ///< rows whose largest logit (first on ties) is the label
};

/// Loss, gradient and correct count for `logits` (f32 [rows, classes]) and `labels` (one per row,
/// each in [0, classes)). The gradient is that of the *sum* of the losses: a mean over a global
/// batch divides once, at the end, so no row's values depend on how the batch is split.
CrossEntropyResult softmax_cross_entropy(const Tensor& logits,
                                         std::span<const std::int32_t> labels);

/// Index of the largest logit of each row (the first on ties; NaN rows give class 0).
std::vector<std::int64_t> predict(const Tensor& logits);

}  // namespace meshtensor::nn
