#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace meshtensor::tokenize {

/// The printable code point GPT-2's byte-level map gives `byte`: printable ASCII and Latin-1
/// bytes keep their own code point, the other 68 take 256, 257, ... in byte order, so every
/// byte sequence is a string of visible characters (a space is U+0120 'Ġ').
char32_t byte_symbol(std::uint8_t byte);

/// The UTF-8 text of the symbols of `bytes`, one symbol per byte.
std::string bytes_to_symbols(std::string_view bytes);

/// The bytes whose symbols `symbols` (UTF-8) holds; nullopt when it holds a code point that is no
/// byte's symbol, or is not UTF-8.
std::optional<std::string> symbols_to_bytes(std::string_view symbols);

}  // namespace meshtensor::tokenize
