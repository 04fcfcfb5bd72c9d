#pragma once

// The C++ tests' one gradient check: a module's backward against central differences.

#include <gtest/gtest.h>

#include <meshtensor/core/tensor.hpp>
#include <meshtensor/nn/gradients.hpp>
#include <meshtensor/nn/module.hpp>

namespace meshtensor::nn {

/// L = sum(module(x) · g): its gradient with respect to the output is g.
inline double objective(Module& module, const Tensor& x, const Tensor& g) {
  const Tensor y = module.forward(x);
  double total = 0.0;
  for (std::size_t i = 0; i < static_cast<std::size_t>(y.numel()); ++i)
    total += static_cast<double>(y.values<float>()[i]) * g.values<float>()[i];
  return total;
}

/// Checks backward's input gradient, and every `parameter_stride`-th value of each parameter's,
/// against central differences of the objective (step 1e-2).
inline void check_gradients(Module& module, const Tensor& x, double tolerance,
                            std::int64_t parameter_stride = 1) {
  const Tensor g = Tensor::random_normal(module.forward(x).shape(), DType::f32, 77);
  DenseGradients sink(module.parameters());
  sink.clear();
  module.forward(x);
  const Tensor dx = module.backward(g, sink, true);
  sink.finish(1);
  const float h = 1e-2f;
  const auto numeric = [&](float& value, const Tensor& input) {
    const float saved = value;
    value = saved + h;
    const double up = objective(module, input, g);
    value = saved - h;
    const double down = objective(module, input, g);
    value = saved;
    return (up - down) / (2 * h);
  };
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    Tensor probe = x.clone();
    const double expected = numeric(probe.values<float>()[static_cast<std::size_t>(i)], probe);
    EXPECT_NEAR(dx.values<float>()[static_cast<std::size_t>(i)], expected, tolerance)
        << "input " << i;
  }
  for (Parameter* p : module.parameters()) {
    for (std::int64_t i = 0; i < p->value.numel(); i += parameter_stride) {
      const double expected = numeric(p->value.values<float>()[static_cast<std::size_t>(i)], x);
      EXPECT_NEAR(p->grad.values<float>()[static_cast<std::size_t>(i)], expected, tolerance)
          << p->name << " " << i;
    }
  }
}

}  // namespace meshtensor::nn
