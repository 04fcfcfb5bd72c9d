#include <bit>
#include <cmath>
#include <cstring>
#include <type_traits>

#include <fmt/format.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/kernels/elementwise.hpp>

#include "combine.hpp"
#include "simd_dispatch.hpp"

namespace meshtensor::kernels {

namespace {

template <class T>
T convert_element(auto source) {
  using S = decltype(source);
  if constexpr (std::is_same_v<S, T>) {
    return source;
  } else if constexpr (std::is_integral_v<S> &&
                       (std::is_same_v<T, float> || std::is_same_v<T, double>)) {
    return static_cast<T>(source);  // one rounding, also for i64 beyond 2^53
  } else {
    return element_from_double<T>(element_to_double(source));
  }
}

// One step of op in T's own arithmetic: halves combine in f32 and round back each time (f32 has
// enough bits that the rounded f32 sum rounds to the correctly rounded half sum).
template <class T>
T combine(T a, T b, ReduceOp op) {
  if constexpr (detail::kIsHalf<T>) {
    const float fa = to_float(a);
    const float fb = to_float(b);
    if (op == ReduceOp::max || op == ReduceOp::min) {
      return detail::order_free_extremum(a, b, fa, fb, op == ReduceOp::max);
    }
    const float sum = fa + fb;
    return sum != sum ? canonical_nan<T>() : element_from_double<T>(static_cast<double>(sum));
  } else {
    return detail::combine_arithmetic<T>(a, b, op);
  }
}

void check_same_layout(const Tensor& a, const Tensor& b, const char* operation) {
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) {
    throw InvalidArgument(fmt::format("{}: tensors differ: {} {} vs {} {}", operation,
                                      dtype_name(a.dtype()), a.shape().to_string(),
                                      dtype_name(b.dtype()), b.shape().to_string()));
  }
}

// Runs `fn(values)` on a contiguous version of `tensor` and writes the result back if needed.
template <class Fn>
void with_contiguous(Tensor& tensor, Fn&& fn) {
  if (tensor.is_contiguous()) {
    fn(tensor);
    return;
  }
  Tensor staged = tensor.clone();
  fn(staged);
  tensor.copy_from(staged);
}

template <class T>
[[gnu::always_inline]] inline void column_sums_body(T* __restrict sums, const T* __restrict rows,
                                                    std::int64_t count, std::int64_t n) {
  for (std::int64_t r = 0; r < count; ++r)
    for (std::int64_t j = 0; j < n; ++j)
      sums[j] += rows[r * n + j];
}
MESHTENSOR_SIMD_KERNEL(column_sums_kernel, column_sums_body)

template <class T>
[[gnu::always_inline]] inline void column_products_body(T* __restrict sums, const T* __restrict a,
                                                        const T* __restrict b, std::int64_t count,
                                                        std::int64_t n) {
  for (std::int64_t r = 0; r < count; ++r)
    for (std::int64_t j = 0; j < n; ++j)
      sums[j] += a[r * n + j] * b[r * n + j];
}
MESHTENSOR_SIMD_KERNEL(column_products_kernel, column_products_body)

/// The bf16 bit pattern of f32 `bits`, to nearest with ties to even (to_bfloat16's rounding,
/// NaN kept quiet with its sign and upper payload), branch-free so that loops of it vectorise.
[[gnu::always_inline]] inline std::uint32_t bf16_bits(std::uint32_t bits) {
  const std::uint32_t rounded = (bits + 0x7FFFU + ((bits >> 16) & 1U)) >> 16;
  const std::uint32_t quiet = (bits >> 16) | 0x40U;
  return (bits & 0x7FFFFFFFU) > 0x7F800000U ? quiet : rounded;
}

/// f32 -> bf16 bit patterns.
template <class T>
[[gnu::always_inline]] inline void to_bf16_body(std::uint16_t* __restrict to,
                                                const std::uint32_t* __restrict from,
                                                std::int64_t count) {
  for (std::int64_t i = 0; i < count; ++i)
    to[i] = static_cast<std::uint16_t>(bf16_bits(from[i]));
}
MESHTENSOR_SIMD_KERNEL(to_bf16_kernel, to_bf16_body)

/// f32 bit patterns rounded to bf16 values, kept in f32.
template <class T>
[[gnu::always_inline]] inline void round_to_bf16_body(std::uint32_t* __restrict to,
                                                      const std::uint32_t* __restrict from,
                                                      std::int64_t count) {
  for (std::int64_t i = 0; i < count; ++i)
    to[i] = bf16_bits(from[i]) << 16;
}
MESHTENSOR_SIMD_KERNEL(round_to_bf16_kernel, round_to_bf16_body)

/// bf16 -> f32 bit patterns (exact).
template <class T>
[[gnu::always_inline]] inline void from_bf16_body(std::uint32_t* __restrict to,
                                                  const std::uint16_t* __restrict from,
                                                  std::int64_t count) {
  for (std::int64_t i = 0; i < count; ++i)
    to[i] = std::uint32_t{from[i]} << 16;
}
MESHTENSOR_SIMD_KERNEL(from_bf16_kernel, from_bf16_body)

}  // namespace

void column_sums_into(float* sums, const float* rows, std::int64_t count, std::int64_t n) {
  column_sums_kernel<float>(sums, rows, count, n);
}

void column_products_into(float* sums, const float* a, const float* b, std::int64_t count,
                          std::int64_t n) {
  column_products_kernel<float>(sums, a, b, count, n);
}

Tensor convert(const Tensor& source, DType dtype) {
  const Tensor input = source.contiguous();
  if (input.dtype() == DType::f32 && dtype == DType::bf16) {  // bf16 compute's operands
    Tensor output = Tensor::uninitialized(input.shape(), dtype);
    to_bf16_kernel<float>(reinterpret_cast<std::uint16_t*>(output.bytes().data()),
                          reinterpret_cast<const std::uint32_t*>(input.bytes().data()),
                          input.numel());
    return output;
  }
  if (input.dtype() == DType::bf16 && dtype == DType::f32) {
    Tensor output = Tensor::uninitialized(input.shape(), dtype);
    from_bf16_kernel<float>(reinterpret_cast<std::uint32_t*>(output.bytes().data()),
                            reinterpret_cast<const std::uint16_t*>(input.bytes().data()),
                            input.numel());
    return output;
  }
  Tensor output(input.shape(), dtype);
  visit_dtype(input.dtype(), [&](auto source_zero) {
    using S = decltype(source_zero);
    visit_dtype(dtype, [&](auto target_zero) {
      using T = decltype(target_zero);
      const auto from = input.values<S>();
      auto to = output.values<T>();
      for (std::size_t i = 0; i < from.size(); ++i)
        to[i] = convert_element<T>(from[i]);
    });
  });
  return output;
}

Tensor as_dtype(const Tensor& source, DType dtype) {
  return source.dtype() == dtype ? source : convert(source, dtype);
}

Tensor rounded_values(const Tensor& source, DType dtype) {
  if (source.dtype() != DType::f32)
    throw InvalidArgument(
        fmt::format("rounded_values of {}: f32 only", dtype_name(source.dtype())));
  if (dtype != DType::bf16) return convert(convert(source, dtype), DType::f32);
  const Tensor input = source.contiguous();
  Tensor output = Tensor::uninitialized(input.shape(), DType::f32);
  round_to_bf16_kernel<float>(reinterpret_cast<std::uint32_t*>(output.bytes().data()),
                              reinterpret_cast<const std::uint32_t*>(input.bytes().data()),
                              input.numel());
  return output;
}

void accumulate(Tensor& target, const Tensor& addend, ReduceOp op) {
  check_same_layout(target, addend, "accumulate");
  const Tensor source = addend.contiguous();
  with_contiguous(target, [&](Tensor& dense) {
    visit_dtype(dense.dtype(), [&](auto zero) {
      using T = decltype(zero);
      auto to = dense.values<T>();
      const auto from = source.values<T>();
      for (std::size_t i = 0; i < to.size(); ++i)
        to[i] = combine(to[i], from[i], op);
    });
  });
}

void divide(Tensor& tensor, double divisor) {
  if (divisor == 0 || std::isnan(divisor)) {
    throw InvalidArgument(fmt::format("divide by {}", divisor));
  }
  with_contiguous(tensor, [&](Tensor& dense) {
    if (dense.dtype() == DType::f32) {
      // The same quotients without a branch, so the loop vectorises (gradients every step).
      const float nan = canonical_nan<float>();
      for (float& value : dense.values<float>())
        value = value != value ? nan : static_cast<float>(static_cast<double>(value) / divisor);
      return;
    }
    visit_dtype(dense.dtype(), [&](auto zero) {
      using T = decltype(zero);
      auto values = dense.values<T>();
      for (auto& value : values) {
        if constexpr (detail::kIsHalf<T> || std::is_floating_point_v<T>) {
          if (std::isnan(element_to_double(value))) {  // as sums: a NaN carries no payload
            value = canonical_nan<T>();
            continue;
          }
        }
        if constexpr (std::is_same_v<T, double>) {
          value = value / divisor;
        } else {
          // Quotients of narrower formats are computed in f64 and rounded once.
          value = element_from_double<T>(element_to_double(value) / divisor);
        }
      }
    });
  });
}

}  // namespace meshtensor::kernels
