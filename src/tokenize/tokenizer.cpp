#include <algorithm>
#include <cstring>
#include <functional>
#include <iterator>
#include <limits>
#include <ostream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <meshtensor/core/base64.hpp>
#include <meshtensor/core/digest.hpp>
#include <meshtensor/core/error.hpp>
#include <meshtensor/core/file.hpp>
#include <meshtensor/core/setting_text.hpp>
#include <meshtensor/core/untrusted_json.hpp>
#include <meshtensor/core/utf8.hpp>
#include <meshtensor/tokenize/byte_level.hpp>
#include <meshtensor/tokenize/tokenizer.hpp>

#include "pipeline_part.hpp"

namespace meshtensor::tokenize {

namespace {

using Json = nlohmann::json;

constexpr std::int64_t kMaxTokenizerBytes = std::int64_t{256} << 20;
constexpr std::int64_t kMaxVocabulary = std::int64_t{1} << 24;
constexpr std::int64_t kMaxUnusedIds = 4096;

std::uint64_t pair_key(std::int64_t left, std::int64_t right) {
  return (static_cast<std::uint64_t>(left) << 32) | static_cast<std::uint64_t>(right);
}

/// The ids of `text` cut at the added tokens of `matcher`: each match's id into `ids`, and each
/// span between matches (the whole text when the set is empty) to `between`.
template <class Between>
void for_each_span(const AddedTokenMatcher& matcher, std::string_view text,
                   std::vector<std::int64_t>& ids, const Between& between) {
  if (matcher.empty()) {
    between(text);
    return;
  }
  for (const TextSpan& span : matcher.split(text)) {
    if (span.token >= 0) {
      ids.push_back(matcher.token(span.token).id);
    } else {
      between(text.substr(span.begin, span.end - span.begin));
    }
  }
}

/// One merge of a tokenizer.json: "left right" or ["left", "right"].
std::pair<std::string, std::string> merge_parts(const Json& merge, const std::string& source) {
  if (merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string())
    return {merge[0].get<std::string>(), merge[1].get<std::string>()};
  if (merge.is_string()) {
    const std::string text = merge.get<std::string>();
    const auto space = text.find(' ');
    if (space != std::string::npos && space > 0 && space + 1 < text.size() &&
        text.find(' ', space + 1) == std::string::npos)
      return {text.substr(0, space), text.substr(space + 1)};
  }
  throw DataError(fmt::format("{}: merge {} is not two tokens", source, json_excerpt(merge)));
}

/// Refuses BPE options that change how a word encodes and that meshtensor does not compute:
/// dropout (random merges skipped), a prefix on continuing subwords or a suffix on a word's
/// last.
void check_model_options(const Json& model, const std::string& source) {
  const auto refuse = [&](const char* key, const std::string& why) {
    throw DataError(
        fmt::format("{}: model \"{}\" is {}: {}", source, key, json_excerpt(model[key]), why));
  };
  if (model.contains("dropout") && !model["dropout"].is_null() &&
      !(model["dropout"].is_number() && model["dropout"].get<double>() == 0.0)) {
    refuse("dropout", "BPE dropout skips merges at random; meshtensor encodes deterministically");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (model.contains(key) && !model[key].is_null() &&
        !(model[key].is_string() && model[key].get<std::string>().empty()))
      refuse(key, "meshtensor computes BPE that marks no subwords");
  }
}

/// A true-or-false field of the model (false when absent or null).
bool model_flag(const Json& model, const char* key, const std::string& source) {
  try {
    return flag_field(model, key, false);
  } catch (const DataError& e) {
    throw DataError(fmt::format("{}: model {}", source, e.what()));
  }
}

/// The "special_roles" meshtensor writes: token names (null: none) and the end ids.
SpecialRoles read_roles(const Json& roles, const std::string& source) {
  const auto bad = [&] {
    return DataError(
        fmt::format("{}: special_roles {} is not bos_token, eos_token, pad_token "
                    "(a token or null) and end_ids (a list of ids)",
                    source, json_excerpt(roles)));
  };
  if (!roles.is_object()) throw bad();
  SpecialRoles out;
  for (const auto& [key, field] :
       {std::pair{"bos_token", &out.bos_token}, std::pair{"eos_token", &out.eos_token},
        std::pair{"pad_token", &out.pad_token}}) {
    const Json& value = roles.contains(key) ? roles[key] : Json();
    if (!value.is_null() && !value.is_string()) throw bad();
    if (value.is_string()) *field = value.get<std::string>();
  }
  const Json& ends = roles.contains("end_ids") ? roles["end_ids"] : Json::array();
  if (!ends.is_array()) throw bad();
  for (const Json& id : ends) {
    if (!id.is_number_integer()) throw bad();
    out.end_ids.push_back(id.get<std::int64_t>());
  }
  return out;
}

/// A part of the file (null when absent).
const Json& part_of(const Json& doc, const char* key) {
  static const Json none;
  return doc.contains(key) ? doc[key] : none;
}

/// One entry of added_tokens: content and id, and the flags Hugging Face's AddedToken has
/// (absent ones take its defaults: special, and normalized unless special).
AddedToken read_added_token(const Json& added, const std::string& source) {
  if (!added.is_object() || !added.contains("content") || !added["content"].is_string() ||
      !added.contains("id") || !added["id"].is_number_integer() ||
      added["content"].get<std::string>().empty()) {
    throw DataError(
        fmt::format("{}: added token {} has no content or id", source, json_excerpt(added)));
  }
  const auto flag = [&](const char* key, bool fallback) {
    if (!added.contains(key) || added[key].is_null()) return fallback;
    if (!added[key].is_boolean()) {
      throw DataError(fmt::format("{}: added token {}: \"{}\" is {}, not true or false", source,
                                  json_excerpt(added["content"]), key, json_excerpt(added[key])));
    }
    return added[key].get<bool>();
  };
  AddedToken token;
  token.content = added["content"].get<std::string>();
  if (!added["id"].is_number_unsigned() && added["id"].get<std::int64_t>() < 0) {
    token.id = added["id"].get<std::int64_t>();
  } else if (added["id"].get<std::uint64_t>() > static_cast<std::uint64_t>(kMaxVocabulary)) {
    throw DataError(fmt::format("{}: added token {} has id {}, past the largest vocabulary ({})",
                                source, json_excerpt(added["content"]), added["id"].dump(),
                                kMaxVocabulary));
  } else {
    token.id = added["id"].get<std::int64_t>();
  }
  token.special = flag("special", true);
  token.single_word = flag("single_word", false);
  token.lstrip = flag("lstrip", false);
  token.rstrip = flag("rstrip", false);
  token.normalized = flag("normalized", !token.special);
  return token;
}

}  // namespace

void Tokenizer::build_matchers() {
  std::vector<AddedToken> raw;
  std::vector<AddedToken> normalized;
  for (const AddedToken& token : added_) {
    if (!token.normalized) {
      raw.push_back(token);
      continue;
    }
    // Matched in normalized text: by its normalized content, as Hugging Face matches it.
    AddedToken matched = token;
    matched.content = normalizer_.apply(token.content);
    if (!matched.content.empty()) normalized.push_back(std::move(matched));
  }
  raw_matcher_ = AddedTokenMatcher(raw);
  normalized_matcher_ = AddedTokenMatcher(normalized);
}

Tokenizer Tokenizer::load(const std::string& path) {
  std::string bytes = read_regular_file(path, kMaxTokenizerBytes, "a tokenizer.json");
  if (bytes.find_first_not_of(" \t\r\n") == std::string::npos) {
    throw DataError(
        fmt::format("{}: empty: neither a tokenizer.json nor a SentencePiece model", path));
  }
  if (looks_like_tiktoken(bytes)) {
    throw DataError(fmt::format(
        "{}: a tiktoken rank file, without its pattern and special tokens: convert it with "
        "`meshtensor tokenizer from-tiktoken --ranks {} --encoding NAME --out tokenizer.json` "
        "(NAME one of {})",
        path, path, tiktoken_encoding_names()));
  }
  if (SentencePieceModel::looks_like_model(bytes))
    return from_sentencepiece(std::move(bytes), path);
  return from_json(bytes, path);
}

Tokenizer Tokenizer::load_tiktoken(const std::string& path, const TiktokenEncoding& encoding) {
  return from_tiktoken(read_regular_file(path, kMaxTokenizerBytes, "a tiktoken rank file"),
                       encoding, path);
}

Tokenizer Tokenizer::from_tiktoken(std::string_view ranks, const TiktokenEncoding& encoding,
                                   const std::string& source) {
  return from_document(tiktoken_document(ranks, encoding, source), source, nullptr);
}

Tokenizer Tokenizer::load_sentencepiece(const std::string& path) {
  return from_sentencepiece(read_regular_file(path, kMaxTokenizerBytes, "a SentencePiece model"),
                            path);
}

Tokenizer Tokenizer::from_sentencepiece(std::string model, const std::string& source) {
  const auto parsed = SentencePieceModel::parse(std::move(model), source);
  Json doc = parsed->hugging_face_json();
  doc["sentencepiece_model"] = base64_encode(parsed->serialized());
  return from_document(doc, source, parsed);
}

Tokenizer Tokenizer::load_gpt2(const std::string& encoder, const std::string& merges) {
  return from_gpt2(read_regular_file(encoder, kMaxTokenizerBytes, "an encoder.json"),
                   read_regular_file(merges, kMaxTokenizerBytes, "a vocab.bpe"), encoder);
}

Tokenizer Tokenizer::from_gpt2(std::string_view encoder, std::string_view merges,
                               const std::string& source) {
  Json vocab = parse_untrusted_json(encoder, source);
  if (!vocab.is_object()) throw DataError(fmt::format("{}: encoder.json is not an object", source));
  Json merge_lines = Json::array();
  std::size_t at = 0;
  while (at < merges.size()) {
    std::size_t end = merges.find('\n', at);
    if (end == std::string_view::npos) end = merges.size();
    std::string_view line = merges.substr(at, end - at);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    // The first line is "#version: ..."; later lines may start with '#' ("# $" is a merge).
    if (!line.empty() && !(at == 0 && line.rfind("#version", 0) == 0))
      merge_lines.push_back(std::string(line));
    at = end + 1;
  }
  Json added = Json::array();
  if (vocab.contains("<|endoftext|>"))
    added.push_back(
        {{"id", vocab["<|endoftext|>"]}, {"content", "<|endoftext|>"}, {"special", true}});
  const Json doc = {
      {"added_tokens", added},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merge_lines}}}};
  return from_json(doc.dump(), source);
}

Tokenizer Tokenizer::from_json(std::string_view text, const std::string& source) {
  return from_document(parse_untrusted_json(text, source), source, nullptr);
}

Tokenizer Tokenizer::from_document(const Json& doc, const std::string& source,
                                   std::shared_ptr<const SentencePieceModel> parsed) {
  if (!doc.is_object()) throw DataError(fmt::format("{}: not a tokenizer.json object", source));
  const Json& model = part_of(doc, "model");
  if (!model.is_object() || model.value("type", "BPE") != "BPE" || !model.contains("vocab") ||
      !model["vocab"].is_object() || !model.contains("merges") || !model["merges"].is_array()) {
    throw DataError(fmt::format("{}: its model is not a BPE with a vocab and merges", source));
  }
  Tokenizer t;
  if (const Json& spm = part_of(doc, "sentencepiece_model"); !spm.is_null()) {
    // The library encodes: the normalizer and pre-tokenizer are kept as written, not computed.
    if (!spm.is_string())
      throw DataError(fmt::format("{}: sentencepiece_model is not a base64 string", source));
    t.sentencepiece_ =
        parsed
            ? std::move(parsed)
            : SentencePieceModel::parse(
                  base64_decode(spm.get<std::string>(), source + ": sentencepiece_model"), source);
    t.sentencepiece_parts_ = {{"normalizer", part_of(doc, "normalizer")},
                              {"pre_tokenizer", part_of(doc, "pre_tokenizer")}};
  } else {
    t.normalizer_ = Normalizer::from_json(part_of(doc, "normalizer"), source);
    t.pre_tokenizer_ = PreTokenizer::from_json(part_of(doc, "pre_tokenizer"), source);
  }
  t.byte_level_ = t.pre_tokenizer_.byte_level();
  const Json& decoder = part_of(doc, "decoder");
  t.decoder_ = decoder.is_null() && t.byte_level_ ? Decoder::byte_level()
                                                  : Decoder::from_json(decoder, source);
  if (t.byte_level_ && !t.decoder_.is_byte_level()) {
    throw DataError(fmt::format("{}: decoder {} is not a ByteLevel, as its pre-tokenizer is",
                                source, json_excerpt(decoder)));
  }
  t.post_processor_ = PostProcessor::from_json(part_of(doc, "post_processor"), source);
  const Json& added_tokens = part_of(doc, "added_tokens");
  if (!added_tokens.is_null() && !added_tokens.is_array()) {
    throw DataError(fmt::format("{}: added_tokens is {}, not a list of tokens", source,
                                json_excerpt(added_tokens)));
  }
  t.read_model(model, added_tokens, source);
  t.build_matchers();
  t.is_special_.resize(t.tokens_.size(), false);
  t.check_references(source);
  t.build_piece_bytes();
  if (const Json& chat = part_of(doc, "chat_template"); !chat.is_null()) {
    if (!chat.is_string())
      throw DataError(fmt::format("{}: chat_template is {}, not a template's text", source,
                                  json_excerpt(chat)));
    t.chat_template_ = chat.get<std::string>();
  }
  if (const Json& roles = part_of(doc, "special_roles"); !roles.is_null())
    t.set_roles(read_roles(roles, source), source);
  if (t.sentencepiece_) {
    const auto pieces = static_cast<std::int64_t>(t.sentencepiece_->size());
    for (std::int64_t id = 0; id < std::max(pieces, t.vocabulary()); ++id) {
      if (id >= pieces || id >= t.vocabulary() ||
          t.tokens_[static_cast<std::size_t>(id)] !=
              t.sentencepiece_->piece(static_cast<std::size_t>(id)))
        throw DataError(fmt::format(
            "{}: its vocabulary and its sentencepiece_model differ at id {}", source, id));
    }
  }
  if (const Json& padded = part_of(doc, "padded_vocabulary"); !padded.is_null()) {
    if (!padded.is_number_integer())
      throw DataError(fmt::format("{}: padded_vocabulary is {}, not a number of ids", source,
                                  json_excerpt(padded)));
    t.pad_vocabulary(padded.get<std::int64_t>(), source);
  }
  // The byte tokenizer's own file (to_json() of bytes()) reads back as the byte tokenizer.
  if (t.has_byte_layout()) return Tokenizer::bytes();
  return t;
}

void Tokenizer::pad_vocabulary(std::int64_t size, const std::string& source) {
  if (size < vocabulary() || size > kMaxVocabulary) {
    throw DataError(
        fmt::format("{}: a vocabulary of {} ids cannot hold the tokenizer's {} (at "
                    "most {})",
                    source, size, vocabulary(), kMaxVocabulary));
  }
  if (size == vocabulary()) return;
  padded_vocabulary_ = size;
  const auto n = static_cast<std::size_t>(size);
  tokens_.resize(n);
  is_added_.resize(n, false);
  is_special_.resize(n, false);
  piece_offsets_.resize(n + 1, piece_offsets_.back());
}

void Tokenizer::read_model(const Json& model, const Json& added_tokens, const std::string& source) {
  check_model_options(model, source);
  ignore_merges_ = model_flag(model, "ignore_merges", source);
  tiktoken_merges_ = model_flag(model, "tiktoken_merges", source);
  byte_fallback_ = model_flag(model, "byte_fallback", source);
  fuse_unk_ = model_flag(model, "fuse_unk", source);
  if (model.contains("unk_token") && !model["unk_token"].is_null()) {
    if (!model["unk_token"].is_string() || model["unk_token"].get<std::string>().empty()) {
      throw DataError(fmt::format("{}: model \"unk_token\" is {}, not a token", source,
                                  json_excerpt(model["unk_token"])));
    }
    unk_token_ = model["unk_token"].get<std::string>();
  }
  // Ids run from 0 with at most kMaxUnusedIds unused among them (cl100k's specials leave some):
  // checked before any table grows to an id.
  const auto entries = static_cast<std::int64_t>(model["vocab"].size() + added_tokens.size());
  ids_.reserve(model["vocab"].size());
  const std::int64_t bound = std::min(entries + kMaxUnusedIds, kMaxVocabulary);
  const auto place = [&](std::int64_t id, const std::string& token, bool added) {
    if (id < 0 || id >= bound) {
      throw DataError(fmt::format(
          "{}: token '{}' has id {}, outside [0, {}) (ids run from 0 over the {} entries of the "
          "file, with at most {} unused)",
          source, token, id, bound, entries, kMaxUnusedIds));
    }
    const auto at = static_cast<std::size_t>(id);
    if (at >= tokens_.size()) {
      tokens_.resize(at + 1);
      is_added_.resize(at + 1, false);
    }
    if (!tokens_[at].empty() && tokens_[at] != token)
      throw DataError(
          fmt::format("{}: id {} is both '{}' and '{}'", source, id, tokens_[at], token));
    tokens_[at] = token;
    is_added_[at] = is_added_[at] || added;
  };
  for (const auto& [token, id] : model["vocab"].items()) {
    if (!id.is_number_integer())
      throw DataError(fmt::format("{}: token '{}' has no integer id", source, token));
    if (id.is_number_unsigned() &&
        id.get<std::uint64_t>() > static_cast<std::uint64_t>(kMaxVocabulary)) {
      throw DataError(fmt::format("{}: token '{}' has id {}, past the largest vocabulary ({})",
                                  source, token, id.dump(), kMaxVocabulary));
    }
    place(id.get<std::int64_t>(), token, false);
    if (!ids_.emplace(token, id.get<std::int64_t>()).second)
      throw DataError(fmt::format("{}: token '{}' appears twice", source, token));
  }
  read_symbols(source);
  std::unordered_map<std::int64_t, std::int64_t> first_merge_making;  // tiktoken_merges_
  for (const Json& merge : model["merges"]) {
    const auto [left, right] = merge_parts(merge, source);
    add_merge(left, right, source, first_merge_making);
  }
  if (ignore_merges_) {
    for (const auto& [entry, id] : ids_) {
      const std::optional<std::string> bytes =
          byte_level_ ? symbols_to_bytes(entry) : std::optional<std::string>(entry);
      if (bytes) whole_ids_.insert(*bytes, id);
    }
  }
  if (added_tokens.is_array()) {
    for (const Json& added : added_tokens) {
      AddedToken token = read_added_token(added, source);
      const auto in_vocab = ids_.find(token.content);
      if (in_vocab == ids_.end() || in_vocab->second != token.id)
        place(token.id, token.content, true);
      is_special_.resize(tokens_.size(), false);
      if (token.special) is_special_[static_cast<std::size_t>(token.id)] = true;
      added_.push_back(std::move(token));
    }
  }
}

void Tokenizer::read_symbols(const std::string& source) {
  if (byte_level_) {
    for (int byte = 0; byte < 256; ++byte) {
      const std::string symbol = bytes_to_symbols(std::string(1, static_cast<char>(byte)));
      const auto found = ids_.find(symbol);
      if (found == ids_.end())
        throw DataError(
            fmt::format("{}: the vocabulary lacks the symbol of byte {}", source, byte));
      byte_ids_[byte] = found->second;
    }
    return;
  }
  for (int byte = 0; byte < 256; ++byte) {
    const std::string entry = fmt::format("<0x{:02X}>", byte);
    const auto found = ids_.find(entry);
    if (byte_fallback_ && found == ids_.end()) {
      throw DataError(fmt::format(
          "{}: byte_fallback needs the 256 tokens <0x00> to <0xFF>: it lacks {}", source, entry));
    }
    byte_ids_[byte] = found == ids_.end() ? -1 : found->second;
  }
  bmp_ids_.assign(0x10000, -1);
  for (const auto& [entry, id] : ids_) {
    char32_t c = 0;
    if (utf8_sequence(entry, 0, c) == static_cast<int>(entry.size())) {
      if (c < 0x10000) {
        bmp_ids_[c] = static_cast<std::int32_t>(id);
      } else {
        astral_ids_.emplace(c, static_cast<std::int32_t>(id));
      }
    }
    char32_t previous = 0;
    for (std::size_t at = 0; at < entry.size(); previous = c) {
      const bool first = at == 0;
      at += static_cast<std::size_t>(std::max(1, utf8_sequence(entry, at, c)));
      if (!first) joined_.insert(pair_key(previous, c));
    }
  }
}

void Tokenizer::check_references(const std::string& source) {
  if (!unk_token_.empty()) {
    const std::optional<std::int64_t> unk = token_id(unk_token_);
    if (!unk) {
      throw DataError(
          fmt::format("{}: model \"unk_token\" '{}' is not in the vocabulary", source, unk_token_));
    }
    unk_id_ = *unk;
  }
  for (const auto* ids : {&post_processor_.before(), &post_processor_.after()}) {
    for (const std::int64_t id : *ids) {
      if (id >= vocabulary()) {
        throw DataError(fmt::format("{}: post_processor adds id {}, outside the vocabulary of {}",
                                    source, id, vocabulary()));
      }
    }
  }
}

void Tokenizer::add_merge(const std::string& left, const std::string& right,
                          const std::string& source,
                          std::unordered_map<std::int64_t, std::int64_t>& first_making) {
  thread_local std::string joined;
  joined.assign(left).append(right);
  const auto l = ids_.find(left);
  const auto r = ids_.find(right);
  const auto m = ids_.find(joined);
  if (l == ids_.end() || r == ids_.end() || m == ids_.end()) {
    throw DataError(
        fmt::format("{}: merge '{} {}' names a token the vocabulary lacks", source, left, right));
  }
  const auto rank = static_cast<std::int64_t>(merges_.size());
  // tiktoken's rule: a pair merges at the rank of the token it makes (the first merge making it).
  const std::int64_t priority =
      tiktoken_merges_ ? first_making.emplace(m->second, rank).first->second : rank;
  if (merge_rank_.insert(pair_key(l->second, r->second), static_cast<std::int32_t>(priority))) {
    merges_.emplace_back(l->second, r->second);
    merged_.push_back(m->second);
  }
}

bool Tokenizer::has_byte_layout() const {
  bool bytes = byte_level_ && merges_.empty() && added_.empty() && normalizer_.empty() &&
               post_processor_.before().empty() && post_processor_.after().empty() &&
               pre_tokenizer_.to_json() == PreTokenizer::plain_byte_level().to_json() &&
               vocabulary() == 256;
  for (int byte = 0; bytes && byte < 256; ++byte)
    bytes = byte_ids_[byte] == byte;
  return bytes;
}

namespace {

/// Calls `take` with consecutive chunks of `piece` of at most `bound` bytes, each cut at a
/// character boundary (a chunk holds at least one byte).
template <class Take>
void for_each_chunk(std::string_view piece, std::size_t bound, const Take& take) {
  std::size_t at = 0;
  while (at < piece.size()) {
    std::size_t end = std::min(piece.size(), at + bound);
    while (end < piece.size() && end > at + 1 &&
           (static_cast<unsigned char>(piece[end]) & 0xC0) == 0x80)
      --end;
    take(piece.substr(at, end - at));
    at = end;
  }
}

}  // namespace

bool Tokenizer::encode_whole(std::string_view piece, std::vector<std::int64_t>& out) const {
  if (!ignore_merges_) return false;
  const std::int64_t whole = whole_ids_.find(piece);
  if (whole < 0) return false;
  out.push_back(whole);
  return true;
}

void Tokenizer::encode_piece(std::string_view piece, std::vector<std::int64_t>& out) const {
  if (encode_whole(piece, out)) return;
  for_each_chunk(piece, kMaxWordBytes, [&](std::string_view chunk) { merge_word(chunk, out); });
}

void Tokenizer::encode_long_piece(std::string_view piece, IdOutput& out) const {
  if (encode_whole(piece, out.ids)) return;
  for_each_chunk(piece, kMaxWordBytes, [&](std::string_view chunk) {
    merge_word(chunk, out.ids);
    out.piece_done();
  });
}

std::int64_t Tokenizer::character_id(char32_t c) const {
  if (c < 0x10000) return bmp_ids_[c];
  const auto found = astral_ids_.find(c);
  return found == astral_ids_.end() ? -1 : found->second;
}

template <class Add>
void Tokenizer::initial_symbols(std::string_view word, const Add& add) const {
  if (byte_level_) {
    for (const char byte : word)
      add(byte_ids_[static_cast<unsigned char>(byte)]);
    return;
  }
  bool after_unknown = false;  // the last symbol is the unknown token
  for (std::size_t at = 0; at < word.size();) {
    char32_t c = 0;
    const auto length = static_cast<std::size_t>(std::max(1, utf8_sequence(word, at, c)));
    const std::string_view bytes = word.substr(at, length);
    at += length;
    if (const std::int64_t id = character_id(c); id >= 0) {
      add(id);
      after_unknown = false;
      continue;
    }
    if (byte_fallback_ && std::ranges::all_of(bytes, [&](char b) {
          return byte_ids_[static_cast<unsigned char>(b)] >= 0;
        })) {
      for (const char b : bytes)
        add(byte_ids_[static_cast<unsigned char>(b)]);
      after_unknown = false;
      continue;
    }
    // Without an unknown token the character is dropped, as Hugging Face drops it.
    if (unk_id_ < 0 || (fuse_unk_ && after_unknown)) continue;
    add(unk_id_);
    after_unknown = true;
  }
}

void Tokenizer::merge_word(std::string_view word, std::vector<std::int64_t>& out) const {
  // Symbols in a list linked by index; a heap of (rank, position) of the pairs that merge.
  struct Symbol {
    std::int32_t id;
    std::int32_t prev;
    std::int32_t next;  // -1: the last
  };
  thread_local std::vector<Symbol> symbols;
  thread_local std::vector<std::uint64_t> heap;
  symbols.clear();
  initial_symbols(word, [&](std::int64_t id) {
    const auto at = static_cast<std::int32_t>(symbols.size());
    symbols.push_back({static_cast<std::int32_t>(id), at - 1, -1});
    if (at > 0) symbols[static_cast<std::size_t>(at - 1)].next = at;
  });
  const auto n = static_cast<std::int32_t>(symbols.size());
  const auto rank_of = [&](std::int32_t left, std::int32_t right) -> std::int64_t {
    return static_cast<std::int64_t>(merge_rank_.find(pair_key(left, right)));
  };
  // Smallest rank first, then the leftmost position: Hugging Face's order.
  const auto push = [&](std::int32_t pos) {
    const Symbol& s = symbols[static_cast<std::size_t>(pos)];
    if (s.next < 0) return;
    const std::int64_t rank = rank_of(s.id, symbols[static_cast<std::size_t>(s.next)].id);
    if (rank < 0) return;
    heap.push_back((static_cast<std::uint64_t>(rank) << 32) | static_cast<std::uint32_t>(pos));
    std::push_heap(heap.begin(), heap.end(), std::greater<>());
  };
  heap.clear();
  for (std::int32_t i = 0; i + 1 < n; ++i)
    push(i);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), std::greater<>());
    const std::uint64_t top = heap.back();
    heap.pop_back();
    const auto rank = static_cast<std::int64_t>(top >> 32);
    const auto pos = static_cast<std::int32_t>(top & 0xFFFFFFFFu);
    Symbol& s = symbols[static_cast<std::size_t>(pos)];
    if (s.id < 0 || s.next < 0) continue;  // merged into its left, or now the last
    // An entry is stale unless the pair there still merges into the same token.
    const std::int64_t now = rank_of(s.id, symbols[static_cast<std::size_t>(s.next)].id);
    if (now < 0 ||
        merged_[static_cast<std::size_t>(now)] != merged_[static_cast<std::size_t>(rank)])
      continue;
    Symbol& right = symbols[static_cast<std::size_t>(s.next)];
    s.id = static_cast<std::int32_t>(merged_[static_cast<std::size_t>(rank)]);
    right.id = -1;
    s.next = right.next;
    if (s.next >= 0) symbols[static_cast<std::size_t>(s.next)].prev = pos;
    if (s.prev >= 0) push(s.prev);
    push(pos);
  }
  for (std::int32_t i = 0; i >= 0 && i < n; i = symbols[static_cast<std::size_t>(i)].next)
    out.push_back(symbols[static_cast<std::size_t>(i)].id);
  if (symbols.capacity() > (std::size_t{1} << 16)) {  // a long word's buffers are not kept
    symbols = {};
    heap = {};
  }
}

void Tokenizer::IdOutput::piece_done() {
  constexpr std::size_t kBatch = std::size_t{1} << 16;
  if (sink == nullptr || ids.size() < kBatch) return;
  (*sink)(ids);
  ids.clear();
}

/// The ids of short pieces seen before in one encode() call: open addressing over a flat table
/// of hashes, the keys and ids in two arenas, so a lookup touches a slot and a few bytes of
/// each arena. It grows to kMaxPieces entries and then only answers.
class Tokenizer::PieceCache {
 public:
  static constexpr std::size_t kMaxPieceBytes = 256;
  static constexpr std::size_t kMaxPieces = std::size_t{1} << 16;

  /// Appends the ids of `piece` to `out` (computed by `encode` the first time).
  template <class Encode>
  void append(std::string_view piece, std::vector<std::int64_t>& out, const Encode& encode) {
    const std::uint64_t hash = hash_bytes(piece);
    std::size_t at = hash & (slots_.size() - 1);
    for (; slots_[at].used; at = (at + 1) & (slots_.size() - 1)) {
      const Slot& slot = slots_[at];
      if (slot.hash == hash && std::string_view(keys_).substr(slot.key, slot.key_length) == piece) {
        out.insert(out.end(), ids_.begin() + slot.ids, ids_.begin() + slot.ids + slot.id_count);
        return;
      }
    }
    const std::size_t first = out.size();
    encode(piece, out);
    if (size_ >= kMaxPieces || out.size() - first > 0xFFFF) return;
    slots_[at] = {hash,
                  static_cast<std::uint32_t>(keys_.size()),
                  static_cast<std::uint32_t>(ids_.size()),
                  static_cast<std::uint16_t>(piece.size()),
                  static_cast<std::uint16_t>(out.size() - first),
                  true};
    keys_.append(piece);
    ids_.insert(ids_.end(), out.begin() + static_cast<std::ptrdiff_t>(first), out.end());
    if (++size_ * 2 > slots_.size()) grow();
  }

 private:
  struct Slot {
    std::uint64_t hash = 0;
    std::uint32_t key = 0;  // offset in keys_
    std::uint32_t ids = 0;  // offset in ids_
    std::uint16_t key_length = 0;
    std::uint16_t id_count = 0;
    bool used = false;
  };
  void grow() {
    std::vector<Slot> old(slots_.size() * 2);
    old.swap(slots_);
    for (const Slot& slot : old) {
      if (!slot.used) continue;
      std::size_t at = slot.hash & (slots_.size() - 1);
      while (slots_[at].used)
        at = (at + 1) & (slots_.size() - 1);
      slots_[at] = slot;
    }
  }

  std::vector<Slot> slots_ = std::vector<Slot>(256);
  std::string keys_;
  std::vector<std::int64_t> ids_;
  std::size_t size_ = 0;
};

template <class Take>
void Tokenizer::for_each_word(std::string_view piece, const Take& take) const {
  std::size_t start = 0;
  char32_t previous = 0;
  bool previous_known = false;
  for (std::size_t at = 0; at < piece.size();) {
    char32_t c = 0;
    const auto length = static_cast<std::size_t>(std::max(1, utf8_sequence(piece, at, c)));
    const bool known = character_id(c) >= 0;
    if (at > start && previous_known && known && !joined_.contains(pair_key(previous, c))) {
      take(piece.substr(start, at - start));
      start = at;
    }
    previous = c;
    previous_known = known;
    at += length;
  }
  if (start < piece.size()) take(piece.substr(start));
}

void Tokenizer::encode_ordinary(std::string_view text, bool at_start, IdOutput& out,
                                PieceCache& cache) const {
  const auto encode = [this](std::string_view piece, std::vector<std::int64_t>& ids) {
    encode_piece(piece, ids);
  };
  const auto encode_word = [&](std::string_view word) {
    if (word.size() > PieceCache::kMaxPieceBytes) {
      encode_long_piece(word, out);
    } else {
      cache.append(word, out.ids, encode);
    }
    out.piece_done();
  };
  pre_tokenizer_.for_each_piece(text, at_start, [&](std::string_view piece) {
    if (byte_level_) {
      encode_word(piece);
    } else {
      for_each_word(piece, encode_word);
    }
  });
}

void Tokenizer::encode_segment(std::string_view given, bool at_start, IdOutput& out,
                               PieceCache& cache) const {
  std::string normalized;
  std::string_view text = given;
  if (!normalizer_.empty()) {
    normalized = normalizer_.apply(given);
    text = normalized;
  }
  for_each_span(normalized_matcher_, text, out.ids, [&](std::string_view between) {
    encode_ordinary(between, at_start && between.data() == text.data(), out, cache);
  });
}

Tokenizer Tokenizer::bytes() {
  Tokenizer t;
  t.raw_bytes_ = true;
  t.pre_tokenizer_ = PreTokenizer::plain_byte_level();
  t.decoder_ = Decoder::byte_level();
  for (int byte = 0; byte < 256; ++byte) {
    t.tokens_.push_back(bytes_to_symbols(std::string(1, static_cast<char>(byte))));
    t.is_added_.push_back(false);
    t.is_special_.push_back(false);
    t.ids_.emplace(t.tokens_.back(), byte);
    t.byte_ids_[byte] = byte;
  }
  t.build_piece_bytes();
  return t;
}

const std::shared_ptr<const Tokenizer>& byte_tokenizer() {
  static const auto shared = std::make_shared<const Tokenizer>(Tokenizer::bytes());
  return shared;
}

std::string Tokenizer::name() const {
  if (raw_bytes_) return "bytes";
  Digest64 digest;
  digest.update(to_json());
  return "bpe:" + digest_hex(digest.finish());
}

std::vector<std::int64_t> Tokenizer::encode(std::string_view text) const {
  IdOutput out;
  encode_into(text, out);
  return std::move(out.ids);
}

std::vector<std::int64_t> Tokenizer::encode_with_specials(std::string_view text) const {
  std::vector<std::int64_t> ids = post_processor_.before();
  IdOutput out;
  out.ids = std::move(ids);
  encode_into(text, out);
  out.ids.insert(out.ids.end(), post_processor_.after().begin(), post_processor_.after().end());
  return std::move(out.ids);
}

void Tokenizer::set_roles(SpecialRoles roles, const std::string& source) {
  for (const std::string* token : {&roles.bos_token, &roles.eos_token, &roles.pad_token}) {
    if (!token->empty() && !token_id(*token))
      throw DataError(
          fmt::format("{}: special token '{}' is not in the tokenizer", source, *token));
  }
  for (const std::int64_t id : roles.end_ids) {
    if (id < 0 || id >= vocabulary() || tokens_[static_cast<std::size_t>(id)].empty())
      throw DataError(fmt::format("{}: end-of-sequence id {} names no token of the {}", source, id,
                                  vocabulary()));
  }
  roles_ = std::move(roles);
}

void Tokenizer::set_post_processor(PostProcessor post_processor, const std::string& source) {
  std::swap(post_processor_, post_processor);
  try {
    check_references(source);
  } catch (...) {
    std::swap(post_processor_, post_processor);
    throw;
  }
}

void Tokenizer::set_special(std::int64_t id, bool special) {
  is_special_.at(static_cast<std::size_t>(id)) = special;
  for (AddedToken& token : added_)
    if (token.id == id) token.special = special;
}

void Tokenizer::encode_each(std::string_view text, const IdSink& take) const {
  IdOutput out;
  out.sink = &take;
  encode_into(text, out);
  if (!out.ids.empty()) take(out.ids);
}

void Tokenizer::encode_into(std::string_view given, IdOutput& out) const {
  if (sentencepiece_) {
    sentencepiece_->encode(given, out.ids);
    return;
  }
  if (raw_bytes_) {
    for (const char byte : given) {
      out.ids.push_back(static_cast<unsigned char>(byte));
      if (out.ids.size() % 4096 == 0) out.piece_done();
    }
    return;
  }
  // Valid text is read in place; only text with invalid bytes is copied to be repaired.
  std::string repaired;
  std::string_view text = given;
  if (!is_valid_utf8(given)) {
    repaired = valid_utf8(given);
    text = repaired;
  }
  PieceCache cache;
  for_each_span(raw_matcher_, text, out.ids, [&](std::string_view between) {
    encode_segment(between, between.data() == text.data(), out, cache);
  });
}

void Tokenizer::build_piece_bytes() {
  piece_bytes_.clear();
  piece_offsets_.assign(1, 0);
  for (std::size_t at = 0; at < tokens_.size(); ++at) {
    piece_bytes_ += is_added_[at] ? tokens_[at] : decoder_.entry_bytes(tokens_[at]);
    piece_offsets_.push_back(static_cast<std::uint32_t>(piece_bytes_.size()));
  }
}

void Tokenizer::check_id(std::int64_t id) const {
  if (id < 0 || id >= vocabulary()) {
    throw InvalidArgument(
        fmt::format("token id {} is outside the vocabulary of {}", id, vocabulary()));
  }
}

std::string Tokenizer::token_bytes(std::int64_t id) const {
  check_id(id);
  return std::string(piece_of(id));
}

std::string Tokenizer::decode(std::span<const std::int64_t> ids) const {
  return decode_text_raw(ids, false);
}

std::string Tokenizer::decode_text(std::span<const std::int64_t> ids, bool skip_special) const {
  std::string out = decode_text_raw(ids, skip_special);
  decoder_.strip(out);
  return out;
}

std::string Tokenizer::decode_text_raw(std::span<const std::int64_t> ids, bool skip_special) const {
  std::size_t bytes = 0;
  for (const std::int64_t id : ids) {
    check_id(id);
    bytes += piece_of(id).size();
  }
  std::string out;
  out.reserve(bytes);
  for (const std::int64_t id : ids) {
    if (!(skip_special && is_special_[static_cast<std::size_t>(id)])) out += piece_of(id);
  }
  return out;
}

std::optional<std::int64_t> Tokenizer::token_id(std::string_view text) const {
  for (const AddedToken& token : added_)
    if (token.content == text) return token.id;
  const auto found = ids_.find(byte_level_ ? bytes_to_symbols(text) : std::string(text));
  if (found == ids_.end()) return std::nullopt;
  return found->second;
}

std::string Tokenizer::to_json() const {
  return document().dump(2);
}

std::string Tokenizer::to_hugging_face_json() const {
  Json doc = document();
  doc.erase("sentencepiece_model");
  doc.erase("special_roles");
  doc.erase("chat_template");
  doc.erase("padded_vocabulary");
  return doc.dump(2);
}

Json Tokenizer::document() const {
  Json vocab = Json::object();
  for (const auto& [symbols, id] : ids_)
    vocab[symbols] = id;
  Json merges = Json::array();
  for (const auto& [left, right] : merges_)
    merges.push_back(Json::array(
        {tokens_[static_cast<std::size_t>(left)], tokens_[static_cast<std::size_t>(right)]}));
  Json added = Json::array();
  for (const AddedToken& token : added_) {
    added.push_back({{"id", token.id},
                     {"content", token.content},
                     {"single_word", token.single_word},
                     {"lstrip", token.lstrip},
                     {"rstrip", token.rstrip},
                     {"normalized", token.normalized},
                     {"special", token.special}});
  }
  Json doc = {{"version", "1.0"},
              {"truncation", nullptr},
              {"padding", nullptr},
              {"added_tokens", added},
              {"normalizer", normalizer_.to_json()},
              {"pre_tokenizer", pre_tokenizer_.to_json()},
              {"post_processor", post_processor_.to_json(byte_level_)},
              {"decoder", decoder_.to_json()},
              {"model",
               {{"type", "BPE"},
                {"dropout", nullptr},
                {"unk_token", unk_token_.empty() ? Json() : Json(unk_token_)},
                {"continuing_subword_prefix", nullptr},
                {"end_of_word_suffix", nullptr},
                {"fuse_unk", fuse_unk_},
                {"byte_fallback", byte_fallback_},
                {"ignore_merges", ignore_merges_},
                {"vocab", vocab},
                {"merges", merges}}}};
  if (tiktoken_merges_) doc["model"]["tiktoken_merges"] = true;
  if (roles_ != SpecialRoles{}) {
    const auto named = [](const std::string& token) {
      return token.empty() ? Json() : Json(token);
    };
    doc["special_roles"] = {{"bos_token", named(roles_.bos_token)},
                            {"eos_token", named(roles_.eos_token)},
                            {"pad_token", named(roles_.pad_token)},
                            {"end_ids", roles_.end_ids}};
  }
  if (!chat_template_.empty()) doc["chat_template"] = chat_template_;
  if (padded_vocabulary_ > 0) doc["padded_vocabulary"] = padded_vocabulary_;
  if (!sentencepiece_) return doc;
  doc["normalizer"] = sentencepiece_parts_["normalizer"];
  doc["pre_tokenizer"] = sentencepiece_parts_["pre_tokenizer"];
  doc["sentencepiece_model"] = base64_encode(sentencepiece_->serialized());
  return doc;
}

void write_ids(std::ostream& out, const Tokenizer& tokenizer, std::string_view text,
               const IdFormat& format) {
  std::string line = format.json ? "[" : "";
  bool first = true;
  const auto write = [&](std::span<const std::int64_t> ids) {
    for (const std::int64_t id : ids) {
      if (!first) line += format.json ? "," : " ";
      first = false;
      fmt::format_to(std::back_inserter(line), "{}", id);
    }
    out << line;
    line.clear();
  };
  if (format.with_specials) write(tokenizer.post_processor().before());
  tokenizer.encode_each(text, write);
  if (format.with_specials) write(tokenizer.post_processor().after());
  out << line << (format.json ? "]\n" : "\n");
}

std::vector<std::int64_t> parse_ids(const std::string& text, const std::string& source) {
  const auto first = text.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && (text[first] == '[' || text[first] == '{')) {
    nlohmann::json doc = parse_untrusted_json(text, source);
    if (doc.is_object() && doc.contains("ids")) doc = doc["ids"];
    if (!doc.is_array()) throw DataError(fmt::format("{}: not a JSON array of token ids", source));
    std::vector<std::int64_t> ids;
    for (const auto& id : doc) {
      if (!id.is_number_integer() ||
          (id.is_number_unsigned() &&
           id.get<std::uint64_t>() >
               static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())))
        throw DataError(fmt::format("{}: {} is not a token id", source, json_excerpt(id)));
      ids.push_back(id.get<std::int64_t>());
    }
    return ids;
  }
  std::vector<std::int64_t> ids;
  std::size_t at = 0;
  while ((at = text.find_first_not_of(" \t\r\n", at)) != std::string::npos) {
    const std::size_t end = std::min(text.find_first_of(" \t\r\n", at), text.size());
    ids.push_back(integer_setting(source, text.substr(at, end - at),
                                  std::numeric_limits<std::int64_t>::min(),
                                  std::numeric_limits<std::int64_t>::max()));
    at = end;
  }
  return ids;
}

}  // namespace meshtensor::tokenize
