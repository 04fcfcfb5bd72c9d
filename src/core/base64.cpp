#include <array>

#include <fmt/format.h>

#include <meshtensor/core/base64.hpp>
#include <meshtensor/core/error.hpp>

namespace meshtensor {

namespace {

constexpr std::string_view kAlphabet =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

}  // namespace

std::string base64_encode(std::string_view bytes) {
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  for (std::size_t at = 0; at < bytes.size(); at += 3) {
    std::uint32_t group = 0;
    const std::size_t n = std::min<std::size_t>(3, bytes.size() - at);
    for (std::size_t i = 0; i < 3; ++i)
      group = (group << 8) | (i < n ? static_cast<unsigned char>(bytes[at + i]) : 0u);
    for (std::size_t i = 0; i < 4; ++i)
      out += i <= n ? kAlphabet[(group >> (18 - 6 * i)) & 63] : '=';
  }
  return out;
}

std::string base64_decode(std::string_view text, const std::string& what) {
  static const std::array<int, 256> value = [] {
    std::array<int, 256> table{};
    table.fill(-1);
    for (std::size_t i = 0; i < kAlphabet.size(); ++i)
      table[static_cast<unsigned char>(kAlphabet[i])] = static_cast<int>(i);
    return table;
  }();
  while (!text.empty() && text.back() == '=')
    text.remove_suffix(1);
  std::string out;
  out.reserve(text.size() * 3 / 4);
  std::uint32_t group = 0;
  int bits = 0;
  for (std::size_t at = 0; at < text.size(); ++at) {
    const int v = value[static_cast<unsigned char>(text[at])];
    if (v < 0) {
      throw DataError(fmt::format("{}: character {} is not base64", what, at));
    }
    group = (group << 6) | static_cast<std::uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += static_cast<char>((group >> bits) & 0xFF);
    }
  }
  return out;
}

}  // namespace meshtensor
