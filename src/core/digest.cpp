#include <fmt/format.h>

#include <meshtensor/core/digest.hpp>
#include <meshtensor/core/random.hpp>

namespace meshtensor {

void Digest64::absorb(std::uint64_t word) {
  state_ = mix64(state_ ^ mix64(word));
  state_ = (state_ << 29 | state_ >> 35) * 0x9E3779B97F4A7C15ull;
}

void Digest64::update(std::span<const std::byte> bytes) {
  for (std::byte b : bytes) {
    pending_ |= static_cast<std::uint64_t>(b) << (8 * pending_bytes_);
    if (++pending_bytes_ == 8) {
      absorb(pending_);
      pending_ = 0;
      pending_bytes_ = 0;
    }
  }
  total_bytes_ += bytes.size();
}

void Digest64::update(std::string_view text) {
  update(std::as_bytes(std::span<const char>(text.data(), text.size())));
}

void Digest64::update_u64(std::uint64_t value) {
  std::byte bytes[8];
  for (int i = 0; i < 8; ++i)
    bytes[i] = static_cast<std::byte>(value >> (8 * i));
  update(bytes);
}

std::uint64_t Digest64::finish() const {
  Digest64 copy = *this;
  copy.absorb(copy.pending_ ^ (std::uint64_t{0x80} << (8 * copy.pending_bytes_)));
  copy.absorb(total_bytes_);
  return mix64(copy.state_);
}

std::string digest_hex(std::uint64_t digest) {
  return fmt::format("{:016x}", digest);
}

}  // namespace meshtensor
