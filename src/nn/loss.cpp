#include <cmath>

#include <fmt/format.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/nn/loss.hpp>

namespace meshtensor::nn {

CrossEntropyResult softmax_cross_entropy(const Tensor& logits,
                                         std::span<const std::int32_t> labels) {
  if (!logits.defined() || logits.rank() != 2 || logits.dtype() != DType::f32) {
    throw InvalidArgument("softmax_cross_entropy needs f32 [rows, classes] logits");
  }
  const Tensor z = logits.contiguous();
  const std::int64_t rows = z.shape()[0];
  const std::int64_t classes = z.shape()[1];
  if (static_cast<std::int64_t>(labels.size()) != rows) {
    throw InvalidArgument(
        fmt::format("softmax_cross_entropy: {} rows of logits but {} labels", rows, labels.size()));
  }
  CrossEntropyResult result{Tensor(Shape{rows}, DType::f64), Tensor(z.shape(), DType::f32), 0};
  const auto in = z.values<float>();
  auto losses = result.losses.values<double>();
  auto grad = result.grad_logits.values<float>();
  const std::vector<std::int64_t> predicted = predict(z);
  std::vector<double> exponentials(static_cast<std::size_t>(classes));
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t label = labels[static_cast<std::size_t>(r)];
    if (label < 0 || label >= classes) {
      throw InvalidArgument(
          fmt::format("label {} of row {} is not below the {} classes", label, r, classes));
    }
    const float* row = in.data() + r * classes;
    double largest = row[0];
    for (std::int64_t c = 1; c < classes; ++c)
      largest = std::max(largest, static_cast<double>(row[c]));
    double total = 0.0;
    for (std::int64_t c = 0; c < classes; ++c) {
      exponentials[static_cast<std::size_t>(c)] = std::exp(row[c] - largest);
      total += exponentials[static_cast<std::size_t>(c)];
    }
    const double log_total = std::log(total);
    losses[static_cast<std::size_t>(r)] = log_total - (row[label] - largest);
    for (std::int64_t c = 0; c < classes; ++c) {
      const double probability = exponentials[static_cast<std::size_t>(c)] / total;
      grad[static_cast<std::size_t>(r * classes + c)] =
          static_cast<float>(probability - (c == label ? 1.0 : 0.0));
    }
    if (predicted[static_cast<std::size_t>(r)] == label) ++result.correct;
  }
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
