#pragma once

#include <cstdint>
#include <memory>
#include <vector>

namespace meshtensor::kernels {

/// Rotary position embedding tables in the rotate-half convention of Hugging Face's Llama code:
/// a head of `head_dim` values is two halves (x1, x2); pair i < head_dim / 2 turns by the angle
/// p · theta^(-2i / head_dim) at position p. Angles, cosines and sines are computed in f64 with
/// the portable functions (kernels/portable_math.hpp) and rounded once to f32: the same bits on
/// every machine, closer to the equations than an f32 angle.
struct RotaryTable {
  std::int64_t head_dim = 0;
  std::int64_t positions = 0;
  std::vector<float> cos;  ///< [positions, head_dim / 2]
  std::vector<float> sin;  ///< [positions, head_dim / 2]
};

/// How the rotation's frequencies are rescaled for contexts longer than the training's, as
/// transformers' `rope_scaling` types compute them: `linear` divides every frequency by
/// `factor`; `llama3` (Llama 3.1/3.2) divides those of wavelengths above
/// original_context / low_freq_factor by `factor`, keeps those below original_context /
/// high_freq_factor, and blends the ones between.
struct RotaryScaling {
  enum class Kind { none, linear, llama3 };
  Kind kind = Kind::none;
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  std::int64_t original_context = 8192;
  bool operator==(const RotaryScaling&) const = default;
};

/// The frequency of each pair i < head_dim / 2 (theta^(-2i / head_dim), rescaled), in f64 with
/// the portable functions. InvalidArgument for a scaling whose factors are not finite and
/// positive, a llama3 scaling whose high_freq_factor is not above low_freq_factor.
std::vector<double> rotary_frequencies(std::int64_t head_dim, double theta,
                                       const RotaryScaling& scaling);

/// The table of positions 0 .. positions - 1. InvalidArgument for an odd or non-positive
/// head_dim, a theta that is not finite and above 1, or no position.
RotaryTable rotary_table(std::int64_t head_dim, std::int64_t positions, double theta,
                         const RotaryScaling& scaling = {});

/// rotary_table(), one copy per process for each set of arguments while any user holds it (the
/// layers of a model share theirs).
std::shared_ptr<const RotaryTable> shared_rotary_table(std::int64_t head_dim,
                                                       std::int64_t positions, double theta,
                                                       const RotaryScaling& scaling = {});

/// Rotates every head of `x` (f32 [rows, heads · head_dim], contiguous) in place, row r at
/// position positions[r]: x1' = x1·cos - x2·sin, x2' = x2·cos + x1·sin, each product rounded to
/// f32 and then summed (the order of q·cos + rotate_half(q)·sin), so a row's bits depend on its
/// values and position alone.
void rotary_forward(float* x, std::int64_t rows, std::int64_t heads, const std::int64_t* positions,
                    const RotaryTable& table);

/// The gradient of rotary_forward (its transpose, the inverse rotation), in place on `grad`.
void rotary_backward(float* grad, std::int64_t rows, std::int64_t heads,
                     const std::int64_t* positions, const RotaryTable& table);

}  // namespace meshtensor::kernels
