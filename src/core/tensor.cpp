#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <new>

#include <fmt/format.h>

#include <meshtensor/core/digest.hpp>
#include <meshtensor/core/error.hpp>
#include <meshtensor/core/random.hpp>
#include <meshtensor/core/storage.hpp>
#include <meshtensor/core/tensor.hpp>

namespace meshtensor {

static_assert(std::endian::native == std::endian::little,
              "digests and wire formats assume a little-endian host");

namespace {
// Writes element `i` of a contiguous tensor from `generate(i)` (a double).
template <class Generate>
Tensor generate_tensor(Shape shape, DType dtype, Generate generate) {
  Tensor tensor(std::move(shape), dtype);
  visit_dtype(dtype, [&](auto zero) {
    using T = decltype(zero);
    auto values = tensor.values<T>();
    for (std::size_t i = 0; i < values.size(); ++i) {
      values[i] = element_from_double<T>(generate(static_cast<std::uint64_t>(i)));
    }
  });
  return tensor;
}
}  // namespace

Tensor::Tensor(Shape shape, DType dtype)
    : dtype_(dtype), shape_(std::move(shape)), strides_(shape_.contiguous_strides()) {
  storage_ = allocate_storage(static_cast<std::size_t>(shape_.numel()) * dtype_size(dtype), true);
}

Tensor Tensor::zeros(Shape shape, DType dtype) {
  return Tensor(std::move(shape), dtype);
}

Tensor Tensor::uninitialized(Shape shape, DType dtype) {
  Tensor tensor;
  tensor.dtype_ = dtype;
  tensor.shape_ = std::move(shape);
  tensor.strides_ = tensor.shape_.contiguous_strides();
  tensor.storage_ =
      allocate_storage(static_cast<std::size_t>(tensor.shape_.numel()) * dtype_size(dtype), false);
  return tensor;
}

Tensor Tensor::wrap(std::shared_ptr<std::byte[]> storage, Shape shape, DType dtype) {
  if (!storage) throw InvalidArgument("Tensor::wrap: null storage");
  const auto address = reinterpret_cast<std::uintptr_t>(storage.get());
  if (address % dtype_size(dtype) != 0) {
    throw InvalidArgument(
        fmt::format("Tensor::wrap: storage at {:#x} is not aligned to the {} bytes of {}", address,
                    dtype_size(dtype), dtype_name(dtype)));
  }
  Tensor tensor;
  tensor.dtype_ = dtype;
  tensor.shape_ = std::move(shape);
  tensor.strides_ = tensor.shape_.contiguous_strides();
  tensor.storage_ = std::move(storage);
  return tensor;
}

Tensor Tensor::full(Shape shape, DType dtype, double value) {
  Tensor tensor(std::move(shape), dtype);
  tensor.fill(value);
  return tensor;
}

Tensor Tensor::arange(Shape shape, DType dtype) {
  return generate_tensor(std::move(shape), dtype,
                         [](std::uint64_t i) { return static_cast<double>(i); });
}

Tensor Tensor::random_normal(Shape shape, DType dtype, std::uint64_t seed) {
  if (!is_floating(dtype)) {
    throw InvalidArgument(
        fmt::format("random_normal needs a floating dtype, got {} (use random_int for integers)",
                    dtype_name(dtype)));
  }
  return generate_tensor(std::move(shape), dtype,
                         [seed](std::uint64_t i) { return normal_sample(seed, i); });
}

Tensor Tensor::random_int(Shape shape, DType dtype, std::uint64_t seed, std::int64_t low,
                          std::int64_t high) {
  return generate_tensor(std::move(shape), dtype, [&](std::uint64_t i) {
    return static_cast<double>(uniform_int_sample(seed, i, low, high));
  });
}

Tensor Tensor::from_values(Shape shape, DType dtype, std::span<const double> values) {
  if (static_cast<std::int64_t>(values.size()) != shape.numel()) {
    throw InvalidArgument(fmt::format("{} values given for shape {} of {} elements", values.size(),
                                      shape.to_string(), shape.numel()));
  }
  return generate_tensor(std::move(shape), dtype, [&](std::uint64_t i) { return values[i]; });
}

bool Tensor::is_contiguous() const {
  if (numel() == 0) return true;
  std::int64_t expected = 1;
  for (int d = rank() - 1; d >= 0; --d) {
    if (shape_[d] != 1 && strides_[static_cast<std::size_t>(d)] != expected) return false;
    expected *= shape_[d];
  }
  return true;
}

void Tensor::check_defined(const char* operation) const {
  if (!defined()) throw InvalidArgument(fmt::format("{} on an undefined tensor", operation));
}

std::byte* Tensor::first_element() const {
  return storage_.get() + static_cast<std::size_t>(offset_) * dtype_size(dtype_);
}

void Tensor::check_typed_access(DType requested) const {
  check_defined("element access");
  if (requested != dtype_) {
    throw InvalidArgument(
        fmt::format("tensor holds {}, not {}", dtype_name(dtype_), dtype_name(requested)));
  }
  if (!is_contiguous()) {
    throw InvalidArgument(
        fmt::format("direct element access needs a contiguous tensor; this {} view "
                    "is strided (call contiguous())",
                    shape_.to_string()));
  }
}

std::span<std::byte> Tensor::bytes() {
  check_defined("bytes()");
  if (!is_contiguous()) {
    throw InvalidArgument(fmt::format("bytes() needs a contiguous tensor; this {} view is strided",
                                      shape_.to_string()));
  }
  return {first_element(), nbytes()};
}

std::span<const std::byte> Tensor::bytes() const {
  return const_cast<Tensor*>(this)->bytes();
}

Tensor Tensor::narrow(int dim, std::int64_t start, std::int64_t length) const {
  check_defined("narrow");
  const std::int64_t size = shape_.at(dim);
  if (start < 0 || length < 0 || start > size || length > size - start) {
    throw InvalidArgument(
        fmt::format("narrow(dim={}, start={}, length={}) is outside dim {} of "
                    "size {} (shape {})",
                    dim, start, length, dim, size, shape_.to_string()));
  }
  Tensor view = *this;
  std::vector<std::int64_t> dims = shape_.dims();
  dims[static_cast<std::size_t>(dim)] = length;
  view.shape_ = Shape(std::move(dims));
  view.offset_ = offset_ + start * strides_[static_cast<std::size_t>(dim)];
  return view;
}

Tensor Tensor::flatten() const {
  check_defined("flatten");
  if (!is_contiguous()) {
    throw InvalidArgument(fmt::format(
        "flatten() needs a contiguous tensor; this {} view is strided", shape_.to_string()));
  }
  Tensor view = *this;
  view.shape_ = Shape({numel()});
  view.strides_ = {1};
  return view;
}

Tensor Tensor::reshape(Shape shape) const {
  check_defined("reshape");
  if (!is_contiguous() || shape.numel() != numel()) {
    throw InvalidArgument(fmt::format(
        "reshape of a {} {} to {} needs a contiguous tensor of as "
        "many elements",
        is_contiguous() ? "contiguous" : "strided", shape_.to_string(), shape.to_string()));
  }
  Tensor view = *this;
  view.strides_.assign(static_cast<std::size_t>(shape.rank()), 1);
  for (int d = shape.rank() - 2; d >= 0; --d) {
    view.strides_[static_cast<std::size_t>(d)] =
        view.strides_[static_cast<std::size_t>(d + 1)] * shape[d + 1];
  }
  view.shape_ = std::move(shape);
  return view;
}

Tensor Tensor::clone() const {
  check_defined("clone");
  Tensor copy = uninitialized(shape_, dtype_);  // copy_from writes every element
  copy.copy_from(*this);
  return copy;
}

Tensor Tensor::contiguous() const {
  return is_contiguous() ? *this : clone();
}

void Tensor::copy_from(const Tensor& source) {
  check_defined("copy_from (destination)");
  source.check_defined("copy_from (source)");
  if (source.dtype_ != dtype_ || source.shape_ != shape_) {
    throw InvalidArgument(fmt::format("copy_from: destination is {} {}, source is {} {}",
                                      dtype_name(dtype_), shape_.to_string(),
                                      dtype_name(source.dtype_), source.shape_.to_string()));
  }
  if (source.storage_ == storage_) {
    // Same buffer: stage through a copy so overlapping views never read what was just written.
    const Tensor staged = source.clone();
    copy_from(staged);
    return;
  }
  // Both sides walk row-major order; stream the source's runs into the destination's.
  std::byte* destination = nullptr;
  std::size_t destination_left = 0;
  std::vector<std::pair<std::byte*, std::size_t>> destination_runs;
  for_each_run([&](std::byte* p, std::size_t n) { destination_runs.emplace_back(p, n); });
  std::size_t next_run = 0;
  const std::size_t element = dtype_size(dtype_);
  source.for_each_run([&](std::byte* p, std::size_t n) {
    while (n > 0) {
      if (destination_left == 0) {
        destination = destination_runs[next_run].first;
        destination_left = destination_runs[next_run].second;
        ++next_run;
      }
      const std::size_t count = std::min(n, destination_left);
      std::memcpy(destination, p, count * element);
      destination += count * element;
      p += count * element;
      destination_left -= count;
      n -= count;
    }
  });
}

void Tensor::fill(double value) {
  check_defined("fill");
  visit_dtype(dtype_, [&](auto zero) {
    using T = decltype(zero);
    const T element = element_from_double<T>(value);
    std::array<std::byte, sizeof(T)> bits{};
    std::memcpy(bits.data(), &element, sizeof(T));
    const bool all_zero =
        std::all_of(bits.begin(), bits.end(), [](std::byte b) { return b == std::byte{0}; });
    for_each_run([&](std::byte* p, std::size_t n) {
      if (all_zero) {
        std::memset(p, 0, n * sizeof(T));
      } else {
        std::fill_n(reinterpret_cast<T*>(p), n, element);  // storage is aligned for T
      }
    });
  });
}

std::int64_t Tensor::element_offset(std::span<const std::int64_t> index) const {
  check_defined("element access");
  if (static_cast<int>(index.size()) != rank()) {
    throw InvalidArgument(
        fmt::format("index has {} entries for a tensor of rank {}", index.size(), rank()));
  }
  std::int64_t offset = offset_;
  for (int d = 0; d < rank(); ++d) {
    const std::int64_t i = index[static_cast<std::size_t>(d)];
    if (i < 0 || i >= shape_[d]) {
      throw InvalidArgument(
          fmt::format("index {} is out of range for dim {} of size {}", i, d, shape_[d]));
    }
    offset += i * strides_[static_cast<std::size_t>(d)];
  }
  return offset;
}

double Tensor::get(std::span<const std::int64_t> index) const {
  const std::int64_t offset = element_offset(index);
  return visit_dtype(dtype_, [&](auto zero) {
    using T = decltype(zero);
    T element;
    std::memcpy(&element, storage_.get() + static_cast<std::size_t>(offset) * sizeof(T), sizeof(T));
    return element_to_double(element);
  });
}

void Tensor::set(std::span<const std::int64_t> index, double value) {
  const std::int64_t offset = element_offset(index);
  visit_dtype(dtype_, [&](auto zero) {
    using T = decltype(zero);
    const T element = element_from_double<T>(value);
    std::memcpy(storage_.get() + static_cast<std::size_t>(offset) * sizeof(T), &element, sizeof(T));
  });
}

std::uint64_t Tensor::digest() const {
  check_defined("digest");
  Digest64 digest;
  digest.update(dtype_name(dtype_));
  digest.update_u64(static_cast<std::uint64_t>(rank()));
  for (std::int64_t dim : shape_.dims())
    digest.update_u64(static_cast<std::uint64_t>(dim));
  const std::size_t element = dtype_size(dtype_);
  for_each_run([&](std::byte* p, std::size_t n) { digest.update({p, n * element}); });
  return digest.finish();
}

bool Tensor::bitwise_equal(const Tensor& other) const {
  if (!defined() || !other.defined()) return defined() == other.defined();
  if (dtype_ != other.dtype_ || shape_ != other.shape_) return false;
  const Tensor a = contiguous();
  const Tensor b = other.contiguous();
  return std::memcmp(a.first_element(), b.first_element(), nbytes()) == 0;
}

}  // namespace meshtensor
