#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/core/profile.hpp>
#include <meshtensor/kernels/portable_math.hpp>
#include <meshtensor/nn/loss.hpp>

namespace meshtensor::nn {

CrossEntropyResult softmax_cross_entropy(const Tensor& logits,
                                         std::span<const std::int32_t> labels) {
  return softmax_cross_entropy(logits, labels, CrossEntropyOptions{});
}

namespace {

/// Each row's largest logit over every rank's classes (f64).
std::vector<double> row_maxima(const float* in, std::int64_t rows, std::int64_t classes,
                               ClassSplit* split) {
  std::vector<double> largest(static_cast<std::size_t>(rows), -HUGE_VAL);
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* row = in + r * classes;
    double m = classes > 0 ? row[0] : -HUGE_VAL;
    for (std::int64_t c = 1; c < classes; ++c)
      m = std::max(m, static_cast<double>(row[c]));
    largest[static_cast<std::size_t>(r)] = m;
  }
  if (split != nullptr) split->all_reduce(largest, ReduceOp::max);
  return largest;
}

/// Rows the loops over the [classes, rows] exponentials run side by side, so that each class
/// touches a cache line or two of them: a row at a time would touch a line a class, each a
/// column's length from the last, and wait on the misses (the store buffer fills up).
constexpr std::int64_t kRowBlock = 16;

/// Fills e[c·rows + r] = exp(logit[r][c] − largest[r]) (the portable exp: the same bits with
/// every C library) and returns each row's total of them,
/// summed in class order.
std::vector<double> exponentials_and_totals(const float* in, std::int64_t rows,
                                            std::int64_t classes,
                                            const std::vector<double>& largest, double* e) {
  std::vector<double> totals(static_cast<std::size_t>(rows), 0.0);
  // A block's exponents, then their exponentials, row by row (vectorised over the classes).
  std::vector<double> exponents(static_cast<std::size_t>(kRowBlock * classes));
  std::vector<double> values(exponents.size());
  for (std::int64_t first_row = 0; first_row < rows; first_row += kRowBlock) {
    const std::int64_t block = std::min(kRowBlock, rows - first_row);
    for (std::int64_t i = 0; i < block; ++i) {
      const float* row = in + (first_row + i) * classes;
      const double top = largest[static_cast<std::size_t>(first_row + i)];
      double* x = exponents.data() + i * classes;
      for (std::int64_t c = 0; c < classes; ++c)
        x[c] = row[c] - top;
    }
    kernels::exp_f64_values(exponents.data(), values.data(), block * classes);
    for (std::int64_t c = 0; c < classes; ++c) {
      for (std::int64_t i = 0; i < block; ++i) {
        const double v = values[static_cast<std::size_t>(i * classes + c)];
        e[c * rows + first_row + i] = v;
        totals[static_cast<std::size_t>(first_row + i)] += v;
      }
    }
  }
  return totals;
}

/// grad[r][c] = e[c·rows + r] / total[r] − (1 where c is row r's label, a class of this rank).
void write_logit_gradients(const double* e, std::int64_t rows, std::int64_t classes,
                           const std::vector<double>& totals, std::span<const std::int32_t> labels,
                           std::int64_t first_class, float* grad) {
  for (std::int64_t first_row = 0; first_row < rows; first_row += kRowBlock) {
    const std::int64_t end_row = std::min(rows, first_row + kRowBlock);
    for (std::int64_t c = 0; c < classes; ++c) {
      for (std::int64_t r = first_row; r < end_row; ++r) {
        const bool is_label = labels[static_cast<std::size_t>(r)] - first_class == c;
        grad[r * classes + c] = static_cast<float>(
            e[c * rows + r] / totals[static_cast<std::size_t>(r)] - (is_label ? 1.0 : 0.0));
      }
    }
  }
}

/// Rows whose first largest logit over every rank's classes is the label.
std::int64_t count_correct(const Tensor& z, std::span<const std::int32_t> labels,
                           ClassSplit* split) {
  const std::vector<std::int64_t> local = predict(z);
  if (split == nullptr) {
    std::int64_t correct = 0;
    for (std::size_t r = 0; r < local.size(); ++r)
      correct += local[r] == labels[r] ? 1 : 0;
    return correct;
  }
  const std::int64_t classes = z.shape()[1];
  const float* in = z.values<float>().data();
  std::vector<double> best(local.size()), index(local.size());
  for (std::size_t r = 0; r < local.size(); ++r) {
    const float v = classes > 0 ? in[static_cast<std::int64_t>(r) * classes + local[r]] : NAN;
    best[r] = v == v ? v : -HUGE_VAL;
  }
  std::vector<double> top = best;
  split->all_reduce(top, ReduceOp::max);
  for (std::size_t r = 0; r < local.size(); ++r) {
    index[r] = classes > 0 && best[r] == top[r]
                   ? static_cast<double>(local[r] + split->first_class())
                   : static_cast<double>(split->classes());
  }
  split->all_reduce(index, ReduceOp::min);
  std::int64_t correct = 0;
  for (std::size_t r = 0; r < local.size(); ++r) {
    const auto predicted = index[r] >= static_cast<double>(split->classes())
                               ? std::int64_t{0}
                               : static_cast<std::int64_t>(index[r]);
    correct += predicted == labels[r] ? 1 : 0;
  }
  return correct;
}

}  // namespace

CrossEntropyResult softmax_cross_entropy(const Tensor& logits, std::span<const std::int32_t> labels,
                                         const CrossEntropyOptions& options) {
  const ProfileScope profile(ProfileRow::loss);
  if (!logits.defined() || logits.rank() != 2 || logits.dtype() != DType::f32) {
    throw InvalidArgument("softmax_cross_entropy needs f32 [rows, classes] logits");
  }
  const Tensor z = logits.contiguous();
  const std::int64_t rows = z.shape()[0];
  const std::int64_t classes = z.shape()[1];
  ClassSplit* split = options.split;
  const std::int64_t first = split != nullptr ? split->first_class() : 0;
  const std::int64_t all_classes = split != nullptr ? split->classes() : classes;
  if (static_cast<std::int64_t>(labels.size()) != rows) {
    throw InvalidArgument(
        fmt::format("softmax_cross_entropy: {} rows of logits but {} labels", rows, labels.size()));
  }
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t label = labels[static_cast<std::size_t>(r)];
    if (label < 0 || label >= all_classes) {
      throw InvalidArgument(
          fmt::format("label {} of row {} is not below the {} classes", label, r, all_classes));
    }
  }
  CrossEntropyResult result{Tensor(Shape{rows}, DType::f64), Tensor(z.shape(), DType::f32), 0};
  const float* in = z.values<float>().data();
  const std::vector<double> largest = row_maxima(in, rows, classes, split);
  // exponentials[c][r]: column r holds row r's terms, so binned column sums give row sums.
  Tensor exponentials = Tensor::uninitialized(Shape{classes, rows}, DType::f64);
  double* e = exponentials.values<double>().data();
  std::vector<double> totals = exponentials_and_totals(in, rows, classes, largest, e);
  std::vector<double> target(static_cast<std::size_t>(rows), 0.0);
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t label = labels[static_cast<std::size_t>(r)] - first;
    if (label >= 0 && label < classes) {
      target[static_cast<std::size_t>(r)] =
          in[r * classes + label] - largest[static_cast<std::size_t>(r)];
    }
  }
  if (options.exact_sums) {
    kernels::BinnedSums sums(rows);
    if (rows > 0 && classes > 0) kernels::add_column_sums(sums, 0, exponentials);
    if (split != nullptr) {
      split->all_reduce_exact(sums, totals);
    } else {
      Tensor rounded = Tensor::uninitialized(Shape{rows}, DType::f64);
      kernels::round_binned_sums(sums, 1, rounded);
      std::copy_n(rounded.values<double>().data(), rows, totals.begin());
    }
  } else if (split != nullptr) {
    split->all_reduce(totals, ReduceOp::sum);
  }
  if (split != nullptr) split->all_reduce(target, ReduceOp::sum);  // one non-zero term
  auto losses = result.losses.values<double>();
  for (std::int64_t r = 0; r < rows; ++r) {
    const double total = totals[static_cast<std::size_t>(r)];
    losses[static_cast<std::size_t>(r)] =
        (std::isfinite(total) && total > 0 ? kernels::portable_log(total) : std::log(total)) -
        target[static_cast<std::size_t>(r)];
  }
  write_logit_gradients(e, rows, classes, totals, labels, first,
                        result.grad_logits.values<float>().data());
  if (options.count_correct) result.correct = count_correct(z, labels, split);
  return result;
}

std::vector<std::int64_t> predict(const Tensor& logits) {
  const Tensor z = logits.contiguous();
  const std::int64_t rows = z.shape()[0];
  const std::int64_t classes = z.shape()[1];
  const auto in = z.values<float>();
  std::vector<std::int64_t> out(static_cast<std::size_t>(rows), 0);
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* row = in.data() + r * classes;
    std::int64_t best = 0;
    for (std::int64_t c = 1; c < classes; ++c)
      if (row[c] > row[best]) best = c;
    out[static_cast<std::size_t>(r)] = best;
  }
  return out;
}

}  // namespace meshtensor::nn
