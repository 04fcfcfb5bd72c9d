#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include <meshtensor/core/dtype.hpp>
#include <meshtensor/core/shape.hpp>

namespace meshtensor {

/// A dense n-d array. Tensors made by the factories own contiguous row-major storage; `narrow`
/// returns a view that shares it (strided, with the innermost stride always 1). Copying a Tensor
/// copies the handle, not the data (use clone()).
class Tensor {
 public:
  /// An undefined tensor (no storage).
  Tensor() = default;
  /// A zero-filled contiguous tensor.
  Tensor(Shape shape, DType dtype);

  /// Zero-filled tensor.
  static Tensor zeros(Shape shape, DType dtype);
  /// A contiguous tensor whose elements are left unset, for a buffer that is overwritten whole
  /// right away (a read from a file): skips the zero-fill pass over its memory.
  static Tensor uninitialized(Shape shape, DType dtype);
  /// A contiguous tensor over memory that someone else owns (a NumPy array, say): `storage`
  /// holds shape.numel() elements of `dtype`, aligned to the element size, and its deleter
  /// releases the memory. Throws InvalidArgument for a null or misaligned pointer.
  static Tensor wrap(std::shared_ptr<std::byte[]> storage, Shape shape, DType dtype);
  /// Tensor with every element equal to `value` (converted to `dtype`).
  static Tensor full(Shape shape, DType dtype, double value);
  /// Element at row-major position i holds i (converted to `dtype`).
  static Tensor arange(Shape shape, DType dtype);
  /// Element i is normal_sample(seed, i) rounded to `dtype`; floating dtypes only.
  static Tensor random_normal(Shape shape, DType dtype, std::uint64_t seed);
  /// Element i is uniform_int_sample(seed, i, low, high) converted to `dtype`.
  static Tensor random_int(Shape shape, DType dtype, std::uint64_t seed, std::int64_t low,
                           std::int64_t high);
  /// Contiguous tensor holding `values` (row-major) converted to `dtype`.
  static Tensor from_values(Shape shape, DType dtype, std::span<const double> values);

  /// False for a default-constructed tensor.
  bool defined() const { return storage_ != nullptr; }
  /// Element type.
  DType dtype() const { return dtype_; }
  /// Dims.
  const Shape& shape() const { return shape_; }
  /// Number of dims.
  int rank() const { return shape_.rank(); }
  /// Number of elements.
  std::int64_t numel() const { return shape_.numel(); }
  /// Bytes the elements occupy (numel * element size).
  std::size_t nbytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype_); }
  /// Element strides.
  const std::vector<std::int64_t>& strides() const { return strides_; }
  /// True when the elements are one dense row-major block.
  bool is_contiguous() const;

  /// View of `length` entries of dim `dim` starting at `start`; shares storage.
  Tensor narrow(int dim, std::int64_t start, std::int64_t length) const;
  /// 1-D view of all elements of a contiguous tensor; shares storage.
  Tensor flatten() const;
  /// View of a contiguous tensor with another shape of as many elements; shares storage.
  Tensor reshape(Shape shape) const;
  /// Contiguous deep copy.
  Tensor clone() const;
  /// This tensor if contiguous, else a contiguous copy.
  Tensor contiguous() const;
  /// Copies the elements of `source` (same shape and dtype) into this tensor or view.
  void copy_from(const Tensor& source);
  /// Sets every element to `value` converted to the dtype.
  void fill(double value);

  /// Element at `index` as a double.
  double get(std::span<const std::int64_t> index) const;
  /// Sets the element at `index` to `value` converted to the dtype.
  void set(std::span<const std::int64_t> index, double value);

  /// The elements of a contiguous tensor of storage type T (checked).
  template <class T>
  std::span<T> values() {
    check_typed_access(dtype_of<T>());
    return {reinterpret_cast<T*>(first_element()), static_cast<std::size_t>(numel())};
  }
  /// Read-only form of values().
  template <class T>
  std::span<const T> values() const {
    check_typed_access(dtype_of<T>());
    return {reinterpret_cast<const T*>(first_element()), static_cast<std::size_t>(numel())};
  }
  /// The bytes of a contiguous tensor (checked).
  std::span<std::byte> bytes();
  /// Read-only form of bytes().
  std::span<const std::byte> bytes() const;

  /// Digest of dtype, shape and element bits in row-major order (stable across platforms).
  std::uint64_t digest() const;
  /// Same dtype, same shape and the same bits in every element.
  bool bitwise_equal(const Tensor& other) const;

  /// Calls `fn(pointer, count)` for each maximal dense run of elements, in row-major order.
  template <class Fn>
  void for_each_run(Fn&& fn) const;

 private:
  std::byte* first_element() const;
  void check_typed_access(DType requested) const;
  void check_defined(const char* operation) const;
  std::int64_t element_offset(std::span<const std::int64_t> index) const;

  std::shared_ptr<std::byte[]> storage_;
  DType dtype_ = DType::f32;
  Shape shape_;
  std::vector<std::int64_t> strides_;
  std::int64_t offset_ = 0;  // in elements
};

template <class Fn>
void Tensor::for_each_run(Fn&& fn) const {
  check_defined("for_each_run");
  if (numel() == 0) return;
  const int dims = rank();
  // Fold inner dims whose elements are adjacent in memory into one run.
  std::int64_t run = 1;
  int outer = dims;
  while (outer > 0 && strides_[static_cast<std::size_t>(outer - 1)] == run) {
    run *= shape_[outer - 1];
    --outer;
  }
  const std::size_t element = dtype_size(dtype_);
  std::vector<std::int64_t> index(static_cast<std::size_t>(outer), 0);
  std::byte* base = first_element();
  while (true) {
    std::int64_t offset = 0;
    for (int d = 0; d < outer; ++d)
      offset += index[static_cast<std::size_t>(d)] * strides_[static_cast<std::size_t>(d)];
    fn(base + static_cast<std::size_t>(offset) * element, static_cast<std::size_t>(run));
    int d = outer - 1;
    for (; d >= 0; --d) {
      auto& i = index[static_cast<std::size_t>(d)];
      if (++i < shape_[d]) break;
      i = 0;
    }
    if (d < 0) return;
  }
}

}  // namespace meshtensor
