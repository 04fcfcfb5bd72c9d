#include <bit>
#include <cstring>

#include <meshtensor/checkpoint/checksum.hpp>

namespace meshtensor::checkpoint {

namespace {

// Weight of word k: an odd start plus an even step per word, so every weight is odd (and so
// invertible modulo 2^64) and neighbouring words weigh differently.
constexpr std::uint64_t kFirstWeight = 0x9E3779B97F4A7C15ull;
constexpr std::uint64_t kWeightStep = 0xD6E8FEB86659FD92ull;

constexpr std::uint64_t weight(std::uint64_t word) {
  return kFirstWeight + kWeightStep * word;
}

std::uint64_t byte_term(std::byte value, std::uint64_t position) {
  return (static_cast<std::uint64_t>(value) << (8 * (position % 8))) * weight(position / 8);
}

}  // namespace

std::uint64_t block_checksum(std::span<const std::byte> bytes, std::uint64_t position) {
  static_assert(std::endian::native == std::endian::little, "words are read little-endian");
  std::uint64_t sum = 0;
  std::size_t i = 0;
  for (; i < bytes.size() && (position + i) % 8 != 0; ++i)
    sum += byte_term(bytes[i], position + i);
  const std::size_t words = (bytes.size() - i) / 8;
  std::uint64_t w = weight((position + i) / 8);
  // Four independent sums keep the multiplier busy.
  std::uint64_t partial[4] = {0, 0, 0, 0};
  std::size_t k = 0;
  for (; k + 4 <= words; k += 4) {
    for (std::size_t j = 0; j < 4; ++j) {
      std::uint64_t word = 0;
      std::memcpy(&word, bytes.data() + i + 8 * (k + j), 8);
      partial[j] += word * (w + kWeightStep * j);
    }
    w += 4 * kWeightStep;
  }
  for (; k < words; ++k) {
    std::uint64_t word = 0;
    std::memcpy(&word, bytes.data() + i + 8 * k, 8);
    partial[0] += word * w;
    w += kWeightStep;
  }
  sum += partial[0] + partial[1] + partial[2] + partial[3];
  for (i += 8 * words; i < bytes.size(); ++i)
    sum += byte_term(bytes[i], position + i);
  return sum;
}

}  // namespace meshtensor::checkpoint
