#include <algorithm>

#include <fmt/format.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/core/shape.hpp>

namespace meshtensor {

Shape::Shape(std::initializer_list<std::int64_t> dims) : Shape(std::vector<std::int64_t>(dims)) {}

Shape::Shape(std::vector<std::int64_t> dims) : dims_(std::move(dims)) {
  bool has_zero = false;
  for (std::int64_t dim : dims_) {
    if (dim < 0) throw InvalidArgument(fmt::format("shape dim {} is negative", dim));
    has_zero = has_zero || dim == 0;
  }
  numel_ = has_zero ? 0 : 1;
  if (has_zero) return;
  for (std::int64_t dim : dims_) {
    if (dim > kMaxNumel / numel_) {
      throw InvalidArgument(
          fmt::format("shape {} has more than 2^48 elements", fmt::join(dims_, "x")));
    }
    numel_ *= dim;
  }
}

std::int64_t Shape::at(int dim) const {
  if (dim < 0 || dim >= rank()) {
    throw InvalidArgument(
        fmt::format("dim {} is out of range for shape {} of rank {}", dim, to_string(), rank()));
  }
  return dims_[static_cast<std::size_t>(dim)];
}

std::vector<std::int64_t> Shape::contiguous_strides() const {
  std::vector<std::int64_t> strides(dims_.size(), 1);
  for (int dim = rank() - 2; dim >= 0; --dim) {
    const auto d = static_cast<std::size_t>(dim);
    strides[d] = strides[d + 1] * std::max<std::int64_t>(dims_[d + 1], 1);
  }
  return strides;
}

std::string Shape::to_string() const {
  if (dims_.empty()) return "scalar";
  return fmt::format("{}", fmt::join(dims_, "x"));
}

std::vector<std::string_view> split(std::string_view text, char separator) {
  std::vector<std::string_view> fields;
  std::size_t start = 0;
  while (true) {
    const std::size_t end = text.find(separator, start);
    if (end == std::string_view::npos) {
      fields.push_back(text.substr(start));
      return fields;
    }
    fields.push_back(text.substr(start, end - start));
    start = end + 1;
  }
}

std::uint64_t parse_unsigned(std::string_view text, std::uint64_t max_value,
                             std::string_view what) {
  if (text.empty())
    throw ParseError(fmt::format("{}: empty where a non-negative integer is expected", what));
  std::uint64_t value = 0;
  for (char c : text) {
    if (c < '0' || c > '9') {
      throw ParseError(fmt::format("{}: '{}' is not a non-negative integer", what, text));
    }
    const auto digit = static_cast<std::uint64_t>(c - '0');
    if (value > (max_value - digit) / 10) {  // value * 10 + digit > max_value, without overflow
      throw ParseError(fmt::format("{}: '{}' is too large (at most {})", what, text, max_value));
    }
    value = value * 10 + digit;
  }
  return value;
}

std::int64_t parse_count(std::string_view text, std::int64_t max_value, std::string_view what) {
  return static_cast<std::int64_t>(
      parse_unsigned(text, static_cast<std::uint64_t>(std::max<std::int64_t>(max_value, 0)), what));
}

Shape parse_shape(std::string_view text) {
  if (text.empty()) throw ParseError("empty shape: expected dims joined by 'x', e.g. 16x16x16");
  std::vector<std::int64_t> dims;
  for (std::string_view field : split(text, 'x')) {
    if (field.empty()) {
      throw ParseError(fmt::format(
          "shape '{}' has an empty dim: expected dims joined by 'x', e.g. 16x16", text));
    }
    dims.push_back(parse_count(field, kMaxNumel, fmt::format("shape '{}'", text)));
  }
  try {
    return Shape(std::move(dims));
  } catch (const InvalidArgument& error) {
    throw ParseError(fmt::format("shape '{}': {}", text, error.what()));
  }
}

}  // namespace meshtensor
