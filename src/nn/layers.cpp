#include <cmath>

#include <fmt/format.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/core/random.hpp>
#include <meshtensor/kernels/matmul.hpp>
#include <meshtensor/nn/layers.hpp>

namespace meshtensor::nn {

namespace {

void check_input(const Tensor& input, std::int64_t features, const std::string& module) {
  if (!input.defined() || input.rank() != 2 || input.dtype() != DType::f32 ||
      input.shape()[1] != features) {
    throw InvalidArgument(fmt::format("{} needs f32 [rows, {}] input, got {} {}", module, features,
                                      input.defined() ? dtype_name(input.dtype()) : "undefined",
                                      input.defined() ? input.shape().to_string() : ""));
  }
}

void check_grad(const Tensor& grad, const Tensor& kept, const std::string& module) {
  if (!kept.defined()) throw InvalidArgument(module + ": backward without a forward");
  if (!grad.defined() || grad.dtype() != DType::f32 || grad.shape() != kept.shape()) {
    throw InvalidArgument(fmt::format("{}: the gradient must be f32 {}, got {}", module,
                                      kept.shape().to_string(),
                                      grad.defined() ? grad.shape().to_string() : "undefined"));
  }
}

/// dx[i] = dy[i] * derivative(x[i]) for an element-wise activation whose input was `input`;
/// undefined when the caller needs no input gradient. Checks the gradient's shape.
template <class Derivative>
Tensor elementwise_backward(const Tensor& input, const Tensor& grad_output, bool need_input_grad,
                            const std::string& module, Derivative&& derivative) {
  check_grad(grad_output, input, module);
  if (!need_input_grad) return {};
  const Tensor dy = grad_output.contiguous();
  Tensor grad_input(dy.shape(), DType::f32);
  const auto x = input.values<float>();
  const auto g = dy.values<float>();
  auto out = grad_input.values<float>();
  for (std::size_t i = 0; i < x.size(); ++i)
    out[i] = derivative(x[i], g[i]);
  return grad_input;
}

}  // namespace

Linear::Linear(std::int64_t in_features, std::int64_t out_features, std::uint64_t seed) {
  if (in_features <= 0 || out_features <= 0) {
    throw InvalidArgument(
        fmt::format("Linear needs positive sizes, got {} -> {}", in_features, out_features));
  }
  weight_.name = "weight";
  weight_.value = Tensor(Shape{in_features, out_features}, DType::f32);
  const double scale = std::sqrt(2.0 / static_cast<double>(in_features));
  auto w = weight_.value.values<float>();
  for (std::size_t i = 0; i < w.size(); ++i)
    w[i] = static_cast<float>(normal_sample(seed, i) * scale);
  weight_.grad = Tensor(weight_.value.shape(), DType::f32);
  bias_.name = "bias";
  bias_.value = Tensor(Shape{out_features}, DType::f32);
  bias_.grad = Tensor(bias_.value.shape(), DType::f32);
}

Tensor Linear::forward(const Tensor& input) {
  const std::int64_t in = weight_.value.shape()[0];
  const std::int64_t out = weight_.value.shape()[1];
  check_input(input, in, describe());
  input_ = input.contiguous();
  const std::int64_t rows = input.shape()[0];
  Tensor output(Shape{rows, out}, DType::f32);
  auto y = output.values<float>();
  const auto b = bias_.value.values<float>();
  for (std::int64_t r = 0; r < rows; ++r)
    std::copy(b.begin(), b.end(), y.begin() + r * out);
  kernels::matmul(input_, kernels::Transpose::no, weight_.value, kernels::Transpose::no, output,
                  /*accumulate=*/true);
  return output;
}

Tensor Linear::backward(const Tensor& grad_output, GradientSink& sink, bool need_input_grad) {
  if (!input_.defined()) throw InvalidArgument(describe() + ": backward without a forward");
  const Shape expected{input_.shape()[0], weight_.value.shape()[1]};
  if (!grad_output.defined() || grad_output.dtype() != DType::f32 ||
      grad_output.shape() != expected) {
    throw InvalidArgument(
        fmt::format("{}: the gradient must be f32 {}", describe(), expected.to_string()));
  }
  const Tensor dy = grad_output.contiguous();
  sink.add_outer_products(weight_, input_, dy);
  sink.add_column_sums(bias_, dy);
  Tensor grad_input;
  if (need_input_grad) {
    grad_input = Tensor(input_.shape(), DType::f32);
    kernels::matmul(dy, kernels::Transpose::no, weight_.value, kernels::Transpose::yes, grad_input);
  }
  input_ = Tensor();
  return grad_input;
}

std::string Linear::describe() const {
  return fmt::format("Linear({}, {})", weight_.value.shape()[0], weight_.value.shape()[1]);
}

Tensor ReLU::forward(const Tensor& input) {
  input_ = input.contiguous();
  Tensor output(input.shape(), DType::f32);
  const auto x = input_.values<float>();
  auto y = output.values<float>();
  for (std::size_t i = 0; i < x.size(); ++i)
    y[i] = x[i] > 0.0f || x[i] != x[i] ? x[i] : 0.0f;
  return output;
}

Tensor ReLU::backward(const Tensor& grad_output, GradientSink&, bool need_input_grad) {
  check_grad(grad_output, input_, "ReLU");
  Tensor grad_input;
  if (need_input_grad) {
    const Tensor dy = grad_output.contiguous();
    grad_input = Tensor(dy.shape(), DType::f32);
    const auto x = input_.values<float>();
    const auto g = dy.values<float>();
    auto out = grad_input.values<float>();
    for (std::size_t i = 0; i < x.size(); ++i)
      out[i] = x[i] > 0.0f ? g[i] : 0.0f;
  }
  input_ = Tensor();
  return grad_input;
}

namespace {
constexpr double kGeluScale = 0.7978845608028654;  // sqrt(2 / pi)
constexpr double kGeluCubic = 0.044715;
}  // namespace

Tensor GELU::forward(const Tensor& input) {
  input_ = input.contiguous();
  Tensor output(input.shape(), DType::f32);
  const auto x = input_.values<float>();
  auto y = output.values<float>();
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double v = x[i];
    y[i] =
        static_cast<float>(0.5 * v * (1.0 + std::tanh(kGeluScale * (v + kGeluCubic * v * v * v))));
  }
  return output;
}

Tensor GELU::backward(const Tensor& grad_output, GradientSink&, bool need_input_grad) {
  Tensor grad_input =
      elementwise_backward(input_, grad_output, need_input_grad, "GELU", [](float x, float g) {
        const double v = x;
        const double t = std::tanh(kGeluScale * (v + kGeluCubic * v * v * v));
        const double inner = kGeluScale * (1.0 + 3.0 * kGeluCubic * v * v);
        const double derivative = 0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * inner;
        return static_cast<float>(g * derivative);
      });
  input_ = Tensor();
  return grad_input;
}

LayerNorm::LayerNorm(std::int64_t features, double epsilon) : epsilon_(epsilon) {
  if (features <= 0)
    throw InvalidArgument(fmt::format("LayerNorm needs features > 0, got {}", features));
  if (!(epsilon > 0.0))
    throw InvalidArgument(fmt::format("LayerNorm epsilon {} is not positive", epsilon));
  weight_ = {"weight", Tensor::full(Shape{features}, DType::f32, 1.0),
             Tensor(Shape{features}, DType::f32)};
  bias_ = {"bias", Tensor(Shape{features}, DType::f32), Tensor(Shape{features}, DType::f32)};
}

Tensor LayerNorm::forward(const Tensor& input) {
  const std::int64_t n = weight_.value.numel();
  check_input(input, n, describe());
  const Tensor x = input.contiguous();
  const std::int64_t rows = x.shape()[0];
  normalized_ = Tensor(x.shape(), DType::f32);
  inverse_std_.assign(static_cast<std::size_t>(rows), 0.0);
  Tensor output(x.shape(), DType::f32);
  const auto in = x.values<float>();
  auto xhat = normalized_.values<float>();
  auto y = output.values<float>();
  const auto gamma = weight_.value.values<float>();
  const auto beta = bias_.value.values<float>();
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* row = in.data() + r * n;
    double mean = 0.0;
    for (std::int64_t j = 0; j < n; ++j)
      mean += row[j];
    mean /= static_cast<double>(n);
    double variance = 0.0;
    for (std::int64_t j = 0; j < n; ++j)
      variance += (row[j] - mean) * (row[j] - mean);
    variance /= static_cast<double>(n);
    const double inverse = 1.0 / std::sqrt(variance + epsilon_);
    inverse_std_[static_cast<std::size_t>(r)] = inverse;
    for (std::int64_t j = 0; j < n; ++j) {
      const float normalized = static_cast<float>((row[j] - mean) * inverse);
      xhat[r * n + j] = normalized;
      y[r * n + j] = normalized * gamma[j] + beta[j];
    }
  }
  return output;
}

Tensor LayerNorm::backward(const Tensor& grad_output, GradientSink& sink, bool need_input_grad) {
  check_grad(grad_output, normalized_, "LayerNorm");
  const Tensor dy = grad_output.contiguous();
  sink.add_column_products(weight_, dy, normalized_);
  sink.add_column_sums(bias_, dy);
  Tensor grad_input;
  if (need_input_grad) {
    const std::int64_t n = weight_.value.numel();
    const std::int64_t rows = dy.shape()[0];
    grad_input = Tensor(dy.shape(), DType::f32);
    const auto g = dy.values<float>();
    const auto xhat = normalized_.values<float>();
    const auto gamma = weight_.value.values<float>();
    auto out = grad_input.values<float>();
    for (std::int64_t r = 0; r < rows; ++r) {
      // dx = (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)) / std, in f64 per row.
      double mean_g = 0.0;
      double mean_gx = 0.0;
      for (std::int64_t j = 0; j < n; ++j) {
        const double dxhat = static_cast<double>(g[r * n + j]) * gamma[j];
        mean_g += dxhat;
        mean_gx += dxhat * xhat[r * n + j];
      }
      mean_g /= static_cast<double>(n);
      mean_gx /= static_cast<double>(n);
      const double inverse = inverse_std_[static_cast<std::size_t>(r)];
      for (std::int64_t j = 0; j < n; ++j) {
        const double dxhat = static_cast<double>(g[r * n + j]) * gamma[j];
        out[r * n + j] = static_cast<float>((dxhat - mean_g - xhat[r * n + j] * mean_gx) * inverse);
      }
    }
  }
  normalized_ = Tensor();
  return grad_input;
}

std::string LayerNorm::describe() const {
  return fmt::format("LayerNorm({})", weight_.value.numel());
}

}  // namespace meshtensor::nn
