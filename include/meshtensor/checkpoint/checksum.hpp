#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace meshtensor::checkpoint {

/// The checksum of a stored block, computed in pieces: block_checksum(bytes, position) is the
/// contribution of `bytes` lying at byte `position` of the block, and the checksum of a block is
/// the wrapping sum of the contributions of any partition of its bytes. So ranks that each read
/// a different part of a block check it together without any rank reading the rest.
///
/// It is a position-weighted sum modulo 2^64: byte q of the block, shifted to bit 8·(q mod 8),
/// is multiplied by an odd weight that depends on q / 8. Any change confined to one aligned
/// 8-byte word changes the sum; it detects corruption and truncation, not tampering.
std::uint64_t block_checksum(std::span<const std::byte> bytes, std::uint64_t position = 0);

}  // namespace meshtensor::checkpoint
