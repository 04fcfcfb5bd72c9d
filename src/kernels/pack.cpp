#include <cstring>

#include <fmt/format.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/kernels/pack.hpp>

namespace meshtensor::kernels {

std::size_t packed_size(std::span<const Tensor> pieces) {
  std::size_t total = 0;
  for (const Tensor& piece : pieces)
    total += piece.nbytes();
  return total;
}

namespace {
void check_buffer(std::span<const Tensor> pieces, std::size_t buffer_size, const char* operation) {
  const std::size_t expected = packed_size(pieces);
  if (buffer_size != expected) {
    throw InvalidArgument(fmt::format("{}: buffer holds {} bytes, the {} pieces need {}", operation,
                                      buffer_size, pieces.size(), expected));
  }
}
}  // namespace

void pack(std::span<const Tensor> pieces, std::span<std::byte> buffer) {
  check_buffer(pieces, buffer.size(), "pack");
  std::byte* cursor = buffer.data();
  for (const Tensor& piece : pieces) {
    const std::size_t element = dtype_size(piece.dtype());
    piece.for_each_run([&](std::byte* p, std::size_t n) {
      std::memcpy(cursor, p, n * element);
      cursor += n * element;
    });
  }
}

void unpack(std::span<const std::byte> buffer, std::span<Tensor> pieces) {
  check_buffer({pieces.data(), pieces.size()}, buffer.size(), "unpack");
  const std::byte* cursor = buffer.data();
  for (Tensor& piece : pieces) {
    const std::size_t element = dtype_size(piece.dtype());
    piece.for_each_run([&](std::byte* p, std::size_t n) {
      std::memcpy(p, cursor, n * element);
      cursor += n * element;
    });
  }
}

}  // namespace meshtensor::kernels
