#include <meshtensor/kernels/activation.hpp>

#include "simd_dispatch.hpp"

namespace meshtensor::kernels {

namespace {

constexpr float kGeluScale = 0.7978845608f;  // sqrt(2 / pi)
constexpr float kGeluCubic = 0.044715f;

template <class T>
[[gnu::always_inline]] inline void gelu_forward_body(const T* x, T* y, std::int64_t count) {
  for (std::int64_t i = 0; i < count; ++i) {
    const T v = x[i];
    const T t = tanh_f32(kGeluScale * (v + kGeluCubic * (v * v * v)));
    const T out = 0.5f * v * (1.0f + t);
    y[i] = v != v ? v : out;
  }
}
MESHTENSOR_SIMD_KERNEL(gelu_forward_kernel, gelu_forward_body)

template <class T>
[[gnu::always_inline]] inline void gelu_backward_body(const T* x, const T* dy, T* dx,
                                                      std::int64_t count) {
  for (std::int64_t i = 0; i < count; ++i) {
    const T v = x[i];
    const T t = tanh_f32(kGeluScale * (v + kGeluCubic * (v * v * v)));
    const T inner = kGeluScale * (1.0f + 3.0f * kGeluCubic * (v * v));
    const T derivative = 0.5f * (1.0f + t) + 0.5f * v * ((1.0f - t * t) * inner);
    const T out = dy[i] * derivative;
    dx[i] = v != v ? v : out;
  }
}
MESHTENSOR_SIMD_KERNEL(gelu_backward_kernel, gelu_backward_body)

}  // namespace

void gelu_forward(const float* x, float* y, std::int64_t count) {
  gelu_forward_kernel<float>(x, y, count);
}

void gelu_backward(const float* x, const float* dy, float* dx, std::int64_t count) {
  gelu_backward_kernel<float>(x, dy, dx, count);
}

}  // namespace meshtensor::kernels
