#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include <meshtensor/core/reduce_op.hpp>
#include <meshtensor/core/tensor.hpp>
#include <meshtensor/kernels/binned_sum.hpp>

namespace meshtensor::nn {

/// Softmax cross-entropy of each row of logits against its class label, row by row.
struct CrossEntropyResult {
  Tensor losses;             ///< f64 [rows]: -log softmax(logits)[label]
  Tensor grad_logits;        ///< f32 [rows, classes]: softmax - onehot (the gradient of the sum)
  std::int64_t correct = 0;  ///< rows whose largest logit (first on ties) is the label
};

/// The ranks over which the classes (a vocabulary) are split: each holds the logits of classes
/// [first_class(), first_class() + its columns) of classes() (vocabulary-parallel loss).
class ClassSplit {
 public:
  virtual ~ClassSplit() = default;
  /// The first class this rank holds.
  virtual std::int64_t first_class() const = 0;
  /// The whole number of classes.
  virtual std::int64_t classes() const = 0;
  /// Reduces `values` over the ranks with `op` (sum in the run's reduction mode), in place.
  virtual void all_reduce(std::span<double> values, ReduceOp op) = 0;
  /// Merges binned sums over the ranks and rounds each element once into `rounded`.
  virtual void all_reduce_exact(kernels::BinnedSums& sums, std::span<double> rounded) = 0;
};

/// How softmax_cross_entropy sums.
struct CrossEntropyOptions {
  /// The softmax denominators as correctly rounded (f64) sums of the exponentials: the same bits
  /// for any split of the classes. false: one f64 sum in class order.
  bool exact_sums = false;
  /// The ranks the classes are split over (null: this rank holds every class).
  ClassSplit* split = nullptr;
  /// Count the rows whose prediction is the label (two more reductions over a split).
  bool count_correct = true;
};

/// Loss, gradient and correct count for `logits` (f32 [rows, classes]) and `labels` (one per row,
/// each in [0, classes)). The gradient is that of the *sum* of the losses: a mean over a global
/// batch divides once, at the end, so no row's values depend on how the batch is split.
CrossEntropyResult softmax_cross_entropy(const Tensor& logits,
                                         std::span<const std::int32_t> labels);

/// The same with `options`: with a split, `logits` holds this rank's classes and the result its
/// columns of the gradient, while the losses and the correct count are whole on every rank.
CrossEntropyResult softmax_cross_entropy(const Tensor& logits, std::span<const std::int32_t> labels,
                                         const CrossEntropyOptions& options);

/// Index of the largest logit of each row (the first on ties; NaN rows give class 0).
std::vector<std::int64_t> predict(const Tensor& logits);

}  // namespace meshtensor::nn
