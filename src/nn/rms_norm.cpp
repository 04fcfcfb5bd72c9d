#include <algorithm>
#include <cmath>
#include <utility>

#include <fmt/format.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/core/profile.hpp>
#include <meshtensor/nn/gradients.hpp>
#include <meshtensor/nn/layers.hpp>

#include "norm_rows.hpp"

namespace meshtensor::nn {

Tensor rms_norm_rows(const Tensor& x, const Tensor& gamma, double epsilon, Tensor* normalized,
                     std::vector<double>* inverse_rms) {
  const std::int64_t rows = x.shape()[0];
  const std::int64_t n = x.shape()[1];
  Tensor output = Tensor::uninitialized(x.shape(), DType::f32);
  if (normalized != nullptr) *normalized = Tensor::uninitialized(x.shape(), DType::f32);
  if (inverse_rms != nullptr) inverse_rms->assign(static_cast<std::size_t>(rows), 0.0);
  const Tensor dense = x.contiguous();
  const float* in = dense.values<float>().data();
  float* y = output.values<float>().data();
  float* xhat = normalized != nullptr ? normalized->values<float>().data() : nullptr;
  const Tensor g = gamma.contiguous();
  const auto scale = g.values<float>();
  // Rows side by side (kNormRows).
  for (std::int64_t r0 = 0; r0 < rows; r0 += kNormRows) {
    const NormRowGroup group = norm_row_group(r0, rows, n);
    const float* row[kNormRows];
    for (std::int64_t r = 0; r < kNormRows; ++r)
      row[r] = in + group.at[static_cast<std::size_t>(r)];
    double squares[kNormRows] = {};
    for (std::int64_t j = 0; j < n; ++j)
      for (std::int64_t r = 0; r < kNormRows; ++r)
        squares[r] += static_cast<double>(row[r][j]) * row[r][j];
    for (std::int64_t r = 0; r < group.count; ++r) {
      const double inverse = 1.0 / std::sqrt(squares[r] / static_cast<double>(n) + epsilon);
      if (inverse_rms != nullptr) (*inverse_rms)[static_cast<std::size_t>(r0 + r)] = inverse;
      const std::int64_t at = group.at[static_cast<std::size_t>(r)];
      for (std::int64_t j = 0; j < n; ++j) {
        const auto value = static_cast<float>(row[r][j] * inverse);
        if (xhat != nullptr) xhat[at + j] = value;
        y[at + j] = value * scale[static_cast<std::size_t>(j)];
      }
    }
  }
  return output;
}

RMSNorm::RMSNorm(std::int64_t features, double epsilon) : epsilon_(epsilon) {
  if (features <= 0)
    throw InvalidArgument(fmt::format("RMSNorm needs features > 0, got {}", features));
  if (!(epsilon > 0.0 && std::isfinite(epsilon)))
    throw InvalidArgument(fmt::format("RMSNorm epsilon {} is not positive", epsilon));
  weight_ = {"weight",
             Tensor::full(Shape{features}, DType::f32, 1.0),
             Tensor(Shape{features}, DType::f32),
             {}};
}

Tensor RMSNorm::forward(const Tensor& input) {
  const ProfileScope profile(ProfileRow::norms_activations);
  const std::int64_t n = weight_.value.numel();
  check_input(input, n, describe());
  const Tensor x = input.contiguous().reshape(Shape{input.numel() / n, n});
  return rms_norm_rows(x, weight_.value, epsilon_, &normalized_, &inverse_rms_)
      .reshape(input.shape());
}

Tensor RMSNorm::backward(const Tensor& grad_output, GradientSink& sink, bool need_input_grad) {
  const ProfileScope profile(ProfileRow::norms_activations);
  if (!normalized_.defined()) throw InvalidArgument("RMSNorm: backward without a forward");
  if (!grad_output.defined() || grad_output.dtype() != DType::f32 ||
      grad_output.numel() != normalized_.numel() ||
      grad_output.shape()[grad_output.rank() - 1] != weight_.value.numel()) {
    throw InvalidArgument(fmt::format("RMSNorm: the gradient must be f32 [..., {}] with {} rows",
                                      weight_.value.numel(), normalized_.shape()[0]));
  }
  const Tensor dy = grad_output.contiguous().reshape(normalized_.shape());
  sink.add_column_products(weight_, dy, normalized_);
  Tensor grad_input;
  if (need_input_grad) {
    const std::int64_t n = weight_.value.numel();
    const std::int64_t rows = dy.shape()[0];
    grad_input = Tensor::uninitialized(dy.shape(), DType::f32);
    const auto g = dy.values<float>();
    const auto xhat = normalized_.values<float>();
    const auto gamma = weight_.value.values<float>();
    auto out = grad_input.values<float>();
    // dx = (dxhat - xhat · mean(dxhat · xhat)) / rms, in f64 per row; rows side by side
    // (kNormRows).
    for (std::int64_t r0 = 0; r0 < rows; r0 += kNormRows) {
      const auto [at, count] = norm_row_group(r0, rows, n);
      double mean_gx[kNormRows] = {};
      for (std::int64_t j = 0; j < n; ++j)
        for (std::int64_t r = 0; r < kNormRows; ++r)
          mean_gx[r] += static_cast<double>(g[at[r] + j]) * gamma[j] * xhat[at[r] + j];
      for (std::int64_t r = 0; r < count; ++r) {
        const double slope = mean_gx[r] / static_cast<double>(n);
        const double inverse = inverse_rms_[static_cast<std::size_t>(r0 + r)];
        for (std::int64_t j = 0; j < n; ++j) {
          const double dxhat = static_cast<double>(g[at[r] + j]) * gamma[j];
          out[at[r] + j] = static_cast<float>((dxhat - xhat[at[r] + j] * slope) * inverse);
        }
      }
    }
    grad_input = grad_input.reshape(grad_output.shape());
  }
  normalized_ = Tensor();
  return grad_input;
}

SavedState RMSNorm::take_saved() {
  SavedState saved;
  saved.tensors.push_back(std::exchange(normalized_, Tensor()));
  saved.reals = std::exchange(inverse_rms_, {});
  return saved;
}

void RMSNorm::restore_saved(SavedState saved) {
  normalized_ = std::move(saved.tensors.at(0));
  inverse_rms_ = std::move(saved.reals);
}

std::string RMSNorm::describe() const {
  return fmt::format("RMSNorm({})", weight_.value.numel());
}

}  // namespace meshtensor::nn
