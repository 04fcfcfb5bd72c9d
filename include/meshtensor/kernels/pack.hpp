#pragma once

#include <cstddef>
#include <span>

#include <meshtensor/core/tensor.hpp>

namespace meshtensor::kernels {

/// Total bytes of `pieces` laid end to end.
std::size_t packed_size(std::span<const Tensor> pieces);

/// Copies each piece (any views) into `buffer` back to back, row-major within each piece.
/// Throws InvalidArgument when the buffer size differs from packed_size(pieces).
void pack(std::span<const Tensor> pieces, std::span<std::byte> buffer);

/// Inverse of pack: fills each piece (any views) from `buffer`.
void unpack(std::span<const std::byte> buffer, std::span<Tensor> pieces);

}  // namespace meshtensor::kernels
