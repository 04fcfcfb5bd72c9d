#pragma once

#include <string>
#include <string_view>

namespace meshtensor {

/// `bytes` in base64 (RFC 4648, with padding).
std::string base64_encode(std::string_view bytes);

/// The bytes `text` holds in base64 (RFC 4648; padding optional). DataError naming `what` and
/// the position of a character outside the alphabet.
std::string base64_decode(std::string_view text, const std::string& what);

}  // namespace meshtensor
