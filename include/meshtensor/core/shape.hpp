#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

namespace meshtensor {

/// Largest element count a shape may describe (2^48), so byte counts never overflow.
inline constexpr std::int64_t kMaxNumel = std::int64_t{1} << 48;

/// Sizes of a tensor's dims. Dims may be 0; the element count is at most kMaxNumel.
class Shape {
 public:
  /// Rank-0 shape (one element).
  Shape() = default;
  /// Throws InvalidArgument for a negative dim or an element count above kMaxNumel.
  Shape(std::initializer_list<std::int64_t> dims);
  /// Same checks as the initializer-list form.
  explicit Shape(std::vector<std::int64_t> dims);

  /// Number of dims.
  int rank() const { return static_cast<int>(dims_.size()); }
  /// Size of dim `dim`; throws InvalidArgument when out of range.
  std::int64_t at(int dim) const;
  /// Size of dim `dim` (unchecked).
  std::int64_t operator[](int dim) const { return dims_[static_cast<std::size_t>(dim)]; }
  /// Product of the dims (1 for rank 0).
  std::int64_t numel() const { return numel_; }
  /// The dims as a vector.
  const std::vector<std::int64_t>& dims() const { return dims_; }
  /// Row-major strides in elements.
  std::vector<std::int64_t> contiguous_strides() const;
  /// "16x16x16"; "scalar" for rank 0.
  std::string to_string() const;

  friend bool operator==(const Shape&, const Shape&) = default;

 private:
  std::vector<std::int64_t> dims_;
  std::int64_t numel_ = 1;
};

/// Parses "16x16x16" (dims >= 0 joined by 'x'); throws ParseError naming the bad token.
Shape parse_shape(std::string_view text);

/// Parses one non-negative decimal integer at most `max_value`; errors start with `what` (the
/// whole value being parsed, e.g. "shape '4xa'") and name the bad token.
std::int64_t parse_count(std::string_view text, std::int64_t max_value, std::string_view what);

/// As parse_count, for the whole unsigned 64-bit range: digits only (no sign, no spaces), never
/// wrapping.
std::uint64_t parse_unsigned(std::string_view text, std::uint64_t max_value, std::string_view what);

/// Splits `text` on `separator`, keeping empty fields.
std::vector<std::string_view> split(std::string_view text, char separator);

}  // namespace meshtensor
