#include <array>

#include <meshtensor/core/utf8.hpp>
#include <meshtensor/tokenize/byte_level.hpp>

namespace meshtensor::tokenize {

namespace {

/// Bytes that are their own symbol: '!'..'~', '¡'..'¬', '®'..'ÿ'.
constexpr bool is_printable(int byte) {
  return (byte >= 0x21 && byte <= 0x7E) || (byte >= 0xA1 && byte <= 0xAC) ||
         (byte >= 0xAE && byte <= 0xFF);
}

constexpr std::array<char32_t, 256> make_symbols() {
  std::array<char32_t, 256> symbols{};
  char32_t next = 256;
  for (int byte = 0; byte < 256; ++byte)
    symbols[static_cast<std::size_t>(byte)] =
        is_printable(byte) ? static_cast<char32_t>(byte) : next++;
  return symbols;
}

constexpr std::array<char32_t, 256> kSymbols = make_symbols();

}  // namespace

char32_t byte_symbol(std::uint8_t byte) {
  return kSymbols[byte];
}

std::string bytes_to_symbols(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (const char b : bytes)
    append_utf8(out, kSymbols[static_cast<unsigned char>(b)]);
  return out;
}

std::optional<std::string> symbols_to_bytes(std::string_view symbols) {
  static const std::array<int, 324> byte_of = [] {
    std::array<int, 324> table{};
    table.fill(-1);
    for (int byte = 0; byte < 256; ++byte)
      table[kSymbols[static_cast<std::size_t>(byte)]] = byte;
    return table;
  }();
  std::string out;
  for (std::size_t at = 0; at < symbols.size();) {
    char32_t c = 0;
    const auto length = static_cast<std::size_t>(utf8_sequence(symbols, at, c));
    if (length == 0 || c >= byte_of.size() || byte_of[c] < 0) return std::nullopt;
    out += static_cast<char>(byte_of[c]);
    at += length;
  }
  return out;
}

}  // namespace meshtensor::tokenize
