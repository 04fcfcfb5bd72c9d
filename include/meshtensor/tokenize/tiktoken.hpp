#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace meshtensor::tokenize {

/// What a tiktoken encoding holds besides its rank file: the pre-tokenizer pattern, the special
/// tokens with their ids, and the special token a text starts with (Llama 3's bos; empty: none).
struct TiktokenEncoding {
  std::string pattern;                                         ///< a PCRE2 pattern
  std::vector<std::pair<std::string, std::int64_t>> specials;  ///< text and id
  std::string bos;  ///< one of `specials` the post-processor puts first, or empty
};

/// The encodings known by name: "cl100k_base" (GPT-4, GPT-3.5), "o200k_base" (GPT-4o),
/// "r50k_base" and "p50k_base" (GPT-3), "llama3" (Llama 3's 256 special tokens from id 128000,
/// <|begin_of_text|> first). InvalidArgument naming any other.
TiktokenEncoding tiktoken_encoding(std::string_view name);

/// `encoding` with the special token `spec` ("TEXT=ID"), which replaces one of the same text or
/// id. ParseError naming `spec` when it is not that.
void set_special_token(TiktokenEncoding& encoding, std::string_view spec);

/// The names tiktoken_encoding() knows, comma-separated.
std::string tiktoken_encoding_names();

/// True when `bytes` starts as a tiktoken rank file does: base64, one space, a number.
bool looks_like_tiktoken(std::string_view bytes);

/// The tokenizer.json document of the rank file `ranks` (one "base64 rank" line per token, as
/// tiktoken and Llama 3's original tokenizer.model hold them) with `encoding`: Hugging Face's
/// byte-level form (a Split by the pattern, then ByteLevel; vocab by rank; as merges every split
/// of a token into two tokens, by the rank of the token, then of its parts; ignore_merges), and
/// "tiktoken_merges" so that meshtensor merges as tiktoken does (the pair that makes the
/// lowest-ranked token first). DataError naming the line of a malformed rank, a repeated token or
/// rank, and the special token whose id a rank holds.
nlohmann::json tiktoken_document(std::string_view ranks, const TiktokenEncoding& encoding,
                                 const std::string& source);

}  // namespace meshtensor::tokenize
