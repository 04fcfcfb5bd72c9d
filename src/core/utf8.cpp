#include <meshtensor/core/utf8.hpp>

namespace meshtensor {

namespace {

int sequence_at(std::string_view text, std::size_t at, char32_t& code_point) {
  const auto byte = [&](std::size_t i) { return static_cast<unsigned char>(text[i]); };
  const unsigned char first = byte(at);
  if (first < 0x80) {
    code_point = first;
    return 1;
  }
  std::size_t length = 0;
  char32_t lowest = 0;
  if ((first & 0xE0) == 0xC0) {
    length = 2, code_point = first & 0x1F, lowest = 0x80;
  } else if ((first & 0xF0) == 0xE0) {
    length = 3, code_point = first & 0x0F, lowest = 0x800;
  } else if ((first & 0xF8) == 0xF0) {
    length = 4, code_point = first & 0x07, lowest = 0x10000;
  } else {
    return 0;
  }
  if (at + length > text.size()) return 0;
  for (std::size_t i = 1; i < length; ++i) {
    if ((byte(at + i) & 0xC0) != 0x80) return 0;
    code_point = (code_point << 6) | (byte(at + i) & 0x3F);
  }
  if (code_point < lowest || code_point > 0x10FFFF ||
      (code_point >= 0xD800 && code_point <= 0xDFFF)) {
    return 0;
  }
  return static_cast<int>(length);
}

/// Bytes of the maximal subpart of an invalid sequence at text[at] (at least 1): the lead byte
/// and the continuation bytes that could still have completed it.
std::size_t invalid_subpart(std::string_view text, std::size_t at) {
  const auto first = static_cast<unsigned char>(text[at]);
  std::size_t length = 0;
  unsigned char low = 0x80;
  unsigned char high = 0xBF;
  if (first >= 0xC2 && first <= 0xDF) {
    length = 2;
  } else if (first >= 0xE0 && first <= 0xEF) {
    length = 3;
    if (first == 0xE0) low = 0xA0;
    if (first == 0xED) high = 0x9F;
  } else if (first >= 0xF0 && first <= 0xF4) {
    length = 4;
    if (first == 0xF0) low = 0x90;
    if (first == 0xF4) high = 0x8F;
  } else {
    return 1;
  }
  std::size_t used = 1;
  while (used < length && at + used < text.size()) {
    const auto next = static_cast<unsigned char>(text[at + used]);
    if (next < low || next > high) break;
    low = 0x80;
    high = 0xBF;
    ++used;
  }
  return used;
}

}  // namespace

int utf8_sequence(std::string_view bytes, std::size_t at, char32_t& code_point) {
  return sequence_at(bytes, at, code_point);
}

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xC0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xE0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  }
}

bool is_valid_utf8(std::string_view text) {
  for (std::size_t at = 0; at < text.size();) {
    if (static_cast<unsigned char>(text[at]) < 0x80) {  // ASCII runs: the common case
      ++at;
      continue;
    }
    char32_t c = 0;
    const int length = utf8_sequence(text, at, c);
    if (length == 0) return false;
    at += static_cast<std::size_t>(length);
  }
  return true;
}

std::string valid_utf8(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t at = 0; at < text.size();) {
    char32_t c = 0;
    const auto length = static_cast<std::size_t>(utf8_sequence(text, at, c));
    if (length > 0) {
      out.append(text.substr(at, length));
      at += length;
    } else {
      append_utf8(out, 0xFFFD);
      at += invalid_subpart(text, at);
    }
  }
  return out;
}

}  // namespace meshtensor
