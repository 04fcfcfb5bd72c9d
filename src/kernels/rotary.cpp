#include <cmath>
#include <mutex>
#include <utility>
#include <vector>

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

std::vector<double> rotary_frequencies(std::int64_t head_dim, double theta,
                                       const RotaryScaling& scaling) {
  const std::int64_t half = head_dim / 2;
  const double log_theta = portable_log(theta);
  std::vector<double> frequency(static_cast<std::size_t>(half));
  for (std::int64_t i = 0; i < half; ++i) {
    frequency[static_cast<std::size_t>(i)] =
        portable_exp(-static_cast<double>(2 * i) / static_cast<double>(head_dim) * log_theta);
  }
  if (scaling.kind == RotaryScaling::Kind::none) return frequency;
  const auto positive = [](double x) { return std::isfinite(x) && x > 0; };
  if (!positive(scaling.factor) || !positive(scaling.low_freq_factor) ||
      !positive(scaling.high_freq_factor) || scaling.original_context < 1) {
    throw InvalidArgument(
        fmt::format("rotary scaling: factor {}, low_freq_factor {}, high_freq_factor {} and "
                    "original_context {} must be positive",
                    scaling.factor, scaling.low_freq_factor, scaling.high_freq_factor,
                    scaling.original_context));
  }
  if (scaling.kind == RotaryScaling::Kind::linear) {
    for (double& f : frequency)
      f /= scaling.factor;
    return frequency;
  }
  if (!(scaling.high_freq_factor > scaling.low_freq_factor)) {
    throw InvalidArgument(
        fmt::format("rotary scaling llama3: high_freq_factor {} must be above low_freq_factor {}",
                    scaling.high_freq_factor, scaling.low_freq_factor));
  }
  const auto original = static_cast<double>(scaling.original_context);
  const double low_wavelength = original / scaling.low_freq_factor;
  const double high_wavelength = original / scaling.high_freq_factor;
  const double two_pi = 2.0 * 3.14159265358979323846;
  for (double& f : frequency) {
    const double wavelength = two_pi / f;
    if (wavelength > low_wavelength) {
      f /= scaling.factor;
    } else if (wavelength >= high_wavelength) {
      const double smooth = (original / wavelength - scaling.low_freq_factor) /
                            (scaling.high_freq_factor - scaling.low_freq_factor);
      f = (1 - smooth) * f / scaling.factor + smooth * f;
    }
  }
  return frequency;
}

RotaryTable rotary_table(std::int64_t head_dim, std::int64_t positions, double theta,
                         const RotaryScaling& scaling) {
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
  const std::vector<double> frequency = rotary_frequencies(head_dim, theta, scaling);
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

std::shared_ptr<const RotaryTable> shared_rotary_table(std::int64_t head_dim,
                                                       std::int64_t positions, double theta,
                                                       const RotaryScaling& scaling) {
  struct Key {
    std::int64_t head_dim;
    std::int64_t positions;
    double theta;
    RotaryScaling scaling;
    bool operator==(const Key&) const = default;
  };
  static std::mutex mutex;
  static std::vector<std::pair<Key, std::weak_ptr<const RotaryTable>>> tables;
  const Key key{head_dim, positions, theta, scaling};
  const std::lock_guard lock(mutex);
  std::erase_if(tables, [](const auto& entry) { return entry.second.expired(); });
  for (const auto& [known, table] : tables)
    if (known == key)
      if (auto held = table.lock()) return held;
  auto table =
      std::make_shared<const RotaryTable>(rotary_table(head_dim, positions, theta, scaling));
  tables.emplace_back(key, table);
  return table;
}

}  // namespace meshtensor::kernels
