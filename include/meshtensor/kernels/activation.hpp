#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>

namespace meshtensor::kernels {

/// e^x in f32 (within 2 ulp), from additions, multiplications and one scaling by a power of two:
/// the same bits on every platform and SIMD level, and a loop of it vectorises. Inputs are
/// clamped to [-87, 88] (results stay normal and finite); NaN gives an unspecified finite value,
/// so callers that must propagate NaN check for it themselves.
[[gnu::always_inline]] inline float exp_f32(float x) {
  x = std::min(std::max(x, -87.0f), 88.0f);
  // n = round(x / ln 2) by the 1.5 * 2^23 trick (no library call, exact under round-to-nearest).
  constexpr float kRound = 12582912.0f;
  const float n = (x * 1.44269504088896341f + kRound) - kRound;
  // r = x - n ln 2 in two steps (Cody-Waite): the high part of ln 2 has trailing zero bits.
  const float r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  const auto exponent = static_cast<std::int32_t>(n) + 127;
  return p * std::bit_cast<float>(exponent << 23);
}

/// tanh(x) = 1 - 2 / (e^(2x) + 1) in f32 from exp_f32 (absolute error below 1e-7).
[[gnu::always_inline]] inline float tanh_f32(float x) {
  return 1.0f - 2.0f / (exp_f32(2.0f * x) + 1.0f);
}

/// y[i] = GELU(x[i]), tanh form: 0.5·x·(1 + tanh(sqrt(2/π)·(x + 0.044715·x³))), in f32 with
/// tanh_f32: the same bits on every SIMD level. NaN stays NaN.
void gelu_forward(const float* x, float* y, std::int64_t count);

/// dx[i] = dy[i] · GELU'(x[i]) for the form of gelu_forward (f32, the same bits everywhere).
void gelu_backward(const float* x, const float* dy, float* dx, std::int64_t count);

/// SwiGLU's gating, elementwise: y[i] = SiLU(gate[i]) · up[i], SiLU(x) = x / (1 + e^-x) with
/// exp_f32 (the same bits on every SIMD level). NaN in `gate` gives NaN.
void swiglu_forward(const float* gate, const float* up, float* y, std::int64_t count);

/// The gradients of swiglu_forward: d_gate[i] = dy[i] · up[i] · SiLU'(gate[i]) and d_up[i] =
/// dy[i] · SiLU(gate[i]), SiLU'(x) = σ(x)·(1 + x·(1 - σ(x))).
void swiglu_backward(const float* gate, const float* up, const float* dy, float* d_gate,
                     float* d_up, std::int64_t count);

}  // namespace meshtensor::kernels
