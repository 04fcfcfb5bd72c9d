#include <utility>

#include <fmt/format.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/core/profile.hpp>
#include <meshtensor/kernels/activation.hpp>
#include <meshtensor/nn/layers.hpp>

namespace meshtensor::nn {

SwiGLU::SwiGLU(std::int64_t block_width) : block_width_(block_width) {
  if (block_width < 1)
    throw InvalidArgument(fmt::format("SwiGLU block width {} is below 1", block_width));
}

std::string SwiGLU::describe() const {
  return fmt::format("SwiGLU(blocks of {})", block_width_);
}

Tensor SwiGLU::forward(const Tensor& input) {
  const ProfileScope profile(ProfileRow::norms_activations);
  const std::int64_t width =
      input.defined() && input.rank() >= 2 ? input.shape()[input.rank() - 1] : 0;
  if (!input.defined() || input.dtype() != DType::f32 || width % (2 * block_width_) != 0 ||
      width == 0) {
    throw InvalidArgument(fmt::format("{} needs f32 [..., blocks of 2 x {}], got {}", describe(),
                                      block_width_,
                                      input.defined() ? input.shape().to_string() : "none"));
  }
  input_shape_ = input.shape();
  input_ = input.contiguous().reshape(Shape{input.numel() / width, width});
  const std::int64_t rows = input_.shape()[0];
  const std::int64_t blocks = width / (2 * block_width_);
  std::vector<std::int64_t> dims = input.shape().dims();
  dims.back() = width / 2;
  Tensor output = Tensor::uninitialized(Shape(dims), DType::f32);
  const float* in = input_.values<float>().data();
  float* out = output.values<float>().data();
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t b = 0; b < blocks; ++b) {
      const float* gate = in + r * width + 2 * b * block_width_;
      kernels::swiglu_forward(gate, gate + block_width_, out + r * (width / 2) + b * block_width_,
                              block_width_);
    }
  }
  return output;
}

Tensor SwiGLU::backward(const Tensor& grad_output, GradientSink&, bool need_input_grad) {
  const ProfileScope profile(ProfileRow::norms_activations);
  if (!input_.defined()) throw InvalidArgument(describe() + ": backward without a forward");
  const std::int64_t width = input_.shape()[1];
  if (!grad_output.defined() || grad_output.numel() * 2 != input_.numel()) {
    throw InvalidArgument(
        fmt::format("{}: the gradient must have {} values", describe(), input_.numel() / 2));
  }
  Tensor grad_input;
  if (need_input_grad) {
    const Tensor dy = grad_output.contiguous();
    grad_input = Tensor::uninitialized(input_.shape(), DType::f32);
    const std::int64_t rows = input_.shape()[0];
    const std::int64_t blocks = width / (2 * block_width_);
    const float* in = input_.values<float>().data();
    const float* d_out = dy.values<float>().data();
    float* d_in = grad_input.values<float>().data();
    for (std::int64_t r = 0; r < rows; ++r) {
      for (std::int64_t b = 0; b < blocks; ++b) {
        const std::int64_t at = r * width + 2 * b * block_width_;
        kernels::swiglu_backward(in + at, in + at + block_width_,
                                 d_out + r * (width / 2) + b * block_width_, d_in + at,
                                 d_in + at + block_width_, block_width_);
      }
    }
    grad_input = grad_input.reshape(input_shape_);
  }
  input_ = Tensor();
  return grad_input;
}

SavedState SwiGLU::take_saved() {
  SavedState saved;
  saved.tensors.push_back(std::exchange(input_, Tensor()));
  saved.shapes.push_back(std::exchange(input_shape_, Shape()));
  return saved;
}

void SwiGLU::restore_saved(SavedState saved) {
  input_ = std::move(saved.tensors.at(0));
  input_shape_ = std::move(saved.shapes.at(0));
}

}  // namespace meshtensor::nn
