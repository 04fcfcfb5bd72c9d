#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include <meshtensor/core/error.hpp>
#include <meshtensor/core/half.hpp>

namespace meshtensor {

/// Element types a tensor can hold.
enum class DType : std::uint8_t { f64, f32, bf16, f16, i64, i32, u8 };

/// Every dtype, in declaration order.
inline constexpr DType kAllDTypes[] = {DType::f64, DType::f32, DType::bf16, DType::f16,
                                       DType::i64, DType::i32, DType::u8};

/// Short name used on the command line and in output ("f32", "bf16", ...).
std::string_view dtype_name(DType dtype);
/// Bytes per element.
std::size_t dtype_size(DType dtype);
/// True for f64, f32, bf16, f16.
bool is_floating(DType dtype);
/// Parses a dtype name; throws ParseError naming the token and listing the valid names.
DType parse_dtype(std::string_view text);

/// The C++ type that stores one element of a dtype.
template <DType D>
struct DTypeTraits;
template <>
struct DTypeTraits<DType::f64> {
  using type = double;
};
template <>
struct DTypeTraits<DType::f32> {
  using type = float;
};
template <>
struct DTypeTraits<DType::bf16> {
  using type = BFloat16;
};
template <>
struct DTypeTraits<DType::f16> {
  using type = Float16;
};
template <>
struct DTypeTraits<DType::i64> {
  using type = std::int64_t;
};
template <>
struct DTypeTraits<DType::i32> {
  using type = std::int32_t;
};
template <>
struct DTypeTraits<DType::u8> {
  using type = std::uint8_t;
};

/// Storage type of dtype `D`.
template <DType D>
using StorageType = typename DTypeTraits<D>::type;

/// The dtype stored as `T`.
template <class T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<double>() {
  return DType::f64;
}
template <>
constexpr DType dtype_of<float>() {
  return DType::f32;
}
template <>
constexpr DType dtype_of<BFloat16>() {
  return DType::bf16;
}
template <>
constexpr DType dtype_of<Float16>() {
  return DType::f16;
}
template <>
constexpr DType dtype_of<std::int64_t>() {
  return DType::i64;
}
template <>
constexpr DType dtype_of<std::int32_t>() {
  return DType::i32;
}
template <>
constexpr DType dtype_of<std::uint8_t>() {
  return DType::u8;
}

/// Calls `fn(T{})` with a value of the storage type of `dtype`; returns what `fn` returns.
template <class Fn>
decltype(auto) visit_dtype(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::f64:
      return std::forward<Fn>(fn)(double{});
    case DType::f32:
      return std::forward<Fn>(fn)(float{});
    case DType::bf16:
      return std::forward<Fn>(fn)(BFloat16{});
    case DType::f16:
      return std::forward<Fn>(fn)(Float16{});
    case DType::i64:
      return std::forward<Fn>(fn)(std::int64_t{});
    case DType::i32:
      return std::forward<Fn>(fn)(std::int32_t{});
    case DType::u8:
      return std::forward<Fn>(fn)(std::uint8_t{});
  }
  throw InvalidArgument("invalid dtype value " + std::to_string(static_cast<int>(dtype)));
}

/// Converts a stored element to double (exact for every dtype except i64 beyond 2^53).
template <class T>
double element_to_double(T value) {
  if constexpr (std::is_same_v<T, Float16> || std::is_same_v<T, BFloat16>) {
    return static_cast<double>(to_float(value));
  } else {
    return static_cast<double>(value);
  }
}

/// Converts a double to a stored element: floats round to nearest even (one rounding), integers
/// round to nearest and saturate at the type's range; NaN becomes 0 for integers.
template <class T>
T element_from_double(double value);

}  // namespace meshtensor
