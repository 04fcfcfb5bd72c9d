#pragma once

// UTF-8 as every layer reads it: validation by the Unicode rules (no overlong forms, surrogates
// or code points above U+10FFFF) and the replacement of invalid bytes.

#include <cstddef>
#include <string>
#include <string_view>

namespace meshtensor {

/// The length (1 to 4) of the valid UTF-8 sequence starting at bytes[at], or 0 when none starts
/// there; `code_point` gets its code point.
int utf8_sequence(std::string_view bytes, std::size_t at, char32_t& code_point);

/// Appends the UTF-8 encoding of `code_point` (at most U+10FFFF) to `out`.
void append_utf8(std::string& out, char32_t code_point);

/// True when all of `text` is valid UTF-8.
bool is_valid_utf8(std::string_view text);

/// `text` with every maximal subpart of an invalid sequence replaced by U+FFFD (the WHATWG
/// decoder's rule, which JavaScript's TextDecoder follows).
std::string valid_utf8(std::string_view text);

}  // namespace meshtensor
