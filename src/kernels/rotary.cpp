#include <cmath>

#include <fmt/format.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/kernels/portable_math.hpp>
#include <meshtensor/kernels/rotary.hpp>

namespace meshtensor::kernels {

namespace {

/// Turns each pair of every head by +angle (sign 1) or -angle (sign -1).
void rotate(float* x, std::int64_t rows, std::int64_t heads, const std::int64_t* positions,
            const RotaryTable& table, float sign) {
  const std::int64_t half = table.head_dim / 2;
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t p = positions[r];
    if (p < 0 || p >= table.positions) {
      throw InvalidArgument(
          fmt::format("rotary position {} is outside the table's {}", p, table.positions));
    }
    const float* c = table.cos.data() + p * half;
    const float* s = table.sin.data() + p * half;
    for (std::int64_t h = 0; h < heads; ++h) {
      float* x1 = x + (r * heads + h) * table.head_dim;
      float* x2 = x1 + half;
      for (std::int64_t i = 0; i < half; ++i) {
        const float a = x1[i];
        const float b = x2[i];
        const float turned = sign * s[i];
        x1[i] = a * c[i] + -b * turned;
        x2[i] = b * c[i] + a * turned;
      }
    }
  }
}

}  // namespace

RotaryTable rotary_table(std::int64_t head_dim, std::int64_t positions, double theta) {
  if (head_dim < 2 || head_dim % 2 != 0) {
    throw InvalidArgument(fmt::format(
        "rotary embeddings turn pairs of values: the head dim {} must be even", head_dim));
  }
  if (!(theta > 1.0 && std::isfinite(theta)))
    throw InvalidArgument(fmt::format("the rotary base theta must be above 1, got {}", theta));
  if (positions < 1)
    throw InvalidArgument(fmt::format("a rotary table needs a position, got {}", positions));
  RotaryTable table;
  table.head_dim = head_dim;
  table.positions = positions;
  const std::int64_t half = head_dim / 2;
  table.cos.resize(static_cast<std::size_t>(positions * half));
  table.sin.resize(static_cast<std::size_t>(positions * half));
  const double log_theta = portable_log(theta);
  std::vector<double> frequency(static_cast<std::size_t>(half));
  for (std::int64_t i = 0; i < half; ++i) {
    frequency[static_cast<std::size_t>(i)] =
        portable_exp(-static_cast<double>(2 * i) / static_cast<double>(head_dim) * log_theta);
  }
  for (std::int64_t p = 0; p < positions; ++p) {
    for (std::int64_t i = 0; i < half; ++i) {
      const double angle = static_cast<double>(p) * frequency[static_cast<std::size_t>(i)];
      table.cos[static_cast<std::size_t>(p * half + i)] = static_cast<float>(portable_cos(angle));
      table.sin[static_cast<std::size_t>(p * half + i)] = static_cast<float>(portable_sin(angle));
    }
  }
  return table;
}

void rotary_forward(float* x, std::int64_t rows, std::int64_t heads, const std::int64_t* positions,
                    const RotaryTable& table) {
  rotate(x, rows, heads, positions, table, 1.0f);
}

void rotary_backward(float* grad, std::int64_t rows, std::int64_t heads,
                     const std::int64_t* positions, const RotaryTable& table) {
  rotate(grad, rows, heads, positions, table, -1.0f);
}

}  // namespace meshtensor::kernels
