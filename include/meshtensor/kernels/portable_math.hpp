#pragma once

// Elementary functions in f64 from additions, multiplications, divisions and power-of-two
// scalings only (no C library call), so their bits are the same on every platform and SIMD
// level: what tables the model computes once (rotary angles, frequencies) are built from. Each is
// within a few units in the last place of the true value, for the ranges documented.

#include <cstdint>

namespace meshtensor::kernels {

/// e^x for |x| <= 700.
double portable_exp(double x);

/// e^x for every x, for the inner loops that need speed (the softmax of the loss): a fixed
/// polynomial in Horner form, no division. Within 2 units in the last place; NaN stays NaN,
/// -inf and x below -745.2 give 0 (or a subnormal on the way), above 709.78 gives +inf.
double exp_f64(double x);

/// out[i] = exp_f64(x[i]) for i < count, vectorised at the kernels' SIMD level with the same
/// operations in the same order (the same bits).
void exp_f64_values(const double* x, double* out, std::int64_t count);

/// The natural logarithm of x > 0 (finite, normal).
double portable_log(double x);

/// sin x and cos x for |x| <= 2^20 (reduced by pi/2 in three exact parts).
double portable_sin(double x);
/// cos x, as portable_sin.
double portable_cos(double x);

}  // namespace meshtensor::kernels
