#include <cmath>
#include <limits>

#include <fmt/format.h>

#include <meshtensor/core/dtype.hpp>
#include <meshtensor/core/enum_names.hpp>

namespace meshtensor {

namespace {
constexpr EnumName<DType> kDTypeNames[] = {
    {DType::f64, "f64"}, {DType::f32, "f32"}, {DType::bf16, "bf16"}, {DType::f16, "f16"},
    {DType::i64, "i64"}, {DType::i32, "i32"}, {DType::u8, "u8"}};
}  // namespace

std::string_view dtype_name(DType dtype) {
  return enum_name(kDTypeNames, dtype, "dtype");
}

std::size_t dtype_size(DType dtype) {
  return visit_dtype(dtype, [](auto value) { return sizeof(value); });
}

bool is_floating(DType dtype) {
  return dtype == DType::f64 || dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f16;
}

DType parse_dtype(std::string_view text) {
  return parse_enum(kDTypeNames, text, "dtype");
}

namespace {
template <class Int>
Int saturating_round(double value) {
  if (std::isnan(value)) return 0;
  const double rounded = std::nearbyint(value);
  // Compare in double against bounds that are exactly representable.
  constexpr double kLow = static_cast<double>(std::numeric_limits<Int>::min());
  constexpr double kHighExclusive = -2.0 * kLow + (kLow == 0 ? 256.0 : 0.0);
  if (rounded <= kLow) return std::numeric_limits<Int>::min();
  if (rounded >= kHighExclusive) return std::numeric_limits<Int>::max();
  return static_cast<Int>(rounded);
}
}  // namespace

template <>
double element_from_double<double>(double value) {
  return value;
}
template <>
float element_from_double<float>(double value) {
  return static_cast<float>(value);
}
template <>
BFloat16 element_from_double<BFloat16>(double value) {
  return to_bfloat16(value);
}
template <>
Float16 element_from_double<Float16>(double value) {
  return to_float16(value);
}
template <>
std::int64_t element_from_double<std::int64_t>(double value) {
  return saturating_round<std::int64_t>(value);
}
template <>
std::int32_t element_from_double<std::int32_t>(double value) {
  return saturating_round<std::int32_t>(value);
}
template <>
std::uint8_t element_from_double<std::uint8_t>(double value) {
  return saturating_round<std::uint8_t>(value);
}

}  // namespace meshtensor
