#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace meshtensor {

/// Streaming 64-bit hash with a fixed algorithm: the same bytes give the same digest on every
/// platform and for every way of splitting them into update() calls.
class Digest64 {
 public:
  /// Adds bytes to the stream.
  void update(std::span<const std::byte> bytes);
  /// Adds the bytes of a string.
  void update(std::string_view text);
  /// Adds a 64-bit integer as 8 little-endian bytes.
  void update_u64(std::uint64_t value);
  /// The digest of everything added so far (the stream may go on afterwards).
  std::uint64_t finish() const;

 private:
  void absorb(std::uint64_t word);

  std::uint64_t state_ = 0x6D65736874656E73ull;
  std::uint64_t pending_ = 0;
  int pending_bytes_ = 0;
  std::uint64_t total_bytes_ = 0;
};

/// 16 lowercase hex digits.
std::string digest_hex(std::uint64_t digest);

}  // namespace meshtensor
