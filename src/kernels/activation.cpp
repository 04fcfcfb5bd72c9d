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

/// σ(x) = 1 / (1 + e^-x) in f32 from exp_f32.
template <class T>
[[gnu::always_inline]] inline T sigmoid(T v) {
  return 1.0f / (1.0f + exp_f32(-v));
}

template <class T>
[[gnu::always_inline]] inline void swiglu_forward_body(const T* gate, const T* up, T* y,
                                                       std::int64_t count) {
  for (std::int64_t i = 0; i < count; ++i) {
    const T v = gate[i];
    const T out = (v * sigmoid(v)) * up[i];
    y[i] = v != v ? v : out;
  }
}
MESHTENSOR_SIMD_KERNEL(swiglu_forward_kernel, swiglu_forward_body)

template <class T>
[[gnu::always_inline]] inline void swiglu_backward_body(const T* gate, const T* up, const T* dy,
                                                        T* d_gate, T* d_up, std::int64_t count) {
  for (std::int64_t i = 0; i < count; ++i) {
    const T v = gate[i];
    const T s = sigmoid(v);
    const T silu = v * s;
    const T derivative = s * (1.0f + v * (1.0f - s));
    const T g = dy[i] * up[i] * derivative;
    d_gate[i] = v != v ? v : g;
    d_up[i] = v != v ? v : dy[i] * silu;
  }
}
MESHTENSOR_SIMD_KERNEL(swiglu_backward_kernel, swiglu_backward_body)

}  // namespace

void swiglu_forward(const float* gate, const float* up, float* y, std::int64_t count) {
  swiglu_forward_kernel<float>(gate, up, y, count);
}

void swiglu_backward(const float* gate, const float* up, const float* dy, float* d_gate,
                     float* d_up, std::int64_t count) {
  swiglu_backward_kernel<float>(gate, up, dy, d_gate, d_up, count);
}

void gelu_forward(const float* x, float* y, std::int64_t count) {
  gelu_forward_kernel<float>(x, y, count);
}

void gelu_backward(const float* x, const float* dy, float* dx, std::int64_t count) {
  gelu_backward_kernel<float>(x, dy, dx, count);
}

}  // namespace meshtensor::kernels
