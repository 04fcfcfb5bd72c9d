#include <algorithm>
#include <limits>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <meshtensor/core/digest.hpp>
#include <meshtensor/core/error.hpp>
#include <meshtensor/core/file.hpp>
#include <meshtensor/core/untrusted_json.hpp>
#include <meshtensor/core/utf8.hpp>
#include <meshtensor/tokenize/byte_level.hpp>
#include <meshtensor/tokenize/tokenizer.hpp>

namespace meshtensor::tokenize {

namespace {

using Json = nlohmann::json;

constexpr std::int64_t kMaxTokenizerBytes = std::int64_t{256} << 20;
constexpr std::int64_t kMaxVocabulary = std::int64_t{1} << 24;

std::uint64_t pair_key(std::int64_t left, std::int64_t right) {
  return (static_cast<std::uint64_t>(left) << 32) | static_cast<std::uint64_t>(right);
}

/// The pre-tokenizer of a tokenizer.json: ByteLevel (with or without its regex), or a Sequence of
/// a Split by a regex (isolated) and a ByteLevel without one. Sets the pattern and the flags.
void read_pre_tokenizer(const Json& spec, const std::string& source,
                        std::optional<SplitPattern>& pattern, bool& gpt2_regex,
                        bool& add_prefix_space) {
  const auto bad = [&](const std::string& why) {
    return DataError(fmt::format("{}: pre_tokenizer {}: {}", source, json_excerpt(spec), why));
  };
  if (!spec.is_object()) throw bad("not a byte-level pre-tokenizer");
  const std::string type = spec.value("type", "");
  if (type == "ByteLevel") {
    add_prefix_space = spec.value("add_prefix_space", false);
    if (spec.value("use_regex", true)) {
      pattern.emplace(std::string(kGpt2Pattern));
      gpt2_regex = true;
    }
    return;
  }
  if (type != "Sequence" || !spec.contains("pretokenizers") || !spec["pretokenizers"].is_array() ||
      spec["pretokenizers"].size() != 2) {
    throw bad("not ByteLevel, nor a Sequence of a Split and a ByteLevel");
  }
  const Json& split = spec["pretokenizers"][0];
  const Json& level = spec["pretokenizers"][1];
  if (!split.is_object() || split.value("type", "") != "Split" ||
      split.value("behavior", "") != "Isolated" || split.value("invert", false) ||
      !split.contains("pattern") || !split["pattern"].is_object() ||
      !split["pattern"].contains("Regex") || !split["pattern"]["Regex"].is_string()) {
    throw bad("its first piece must be a Split by a Regex, Isolated, not inverted");
  }
  if (!level.is_object() || level.value("type", "") != "ByteLevel" ||
      level.value("use_regex", true)) {
    throw bad("its second piece must be a ByteLevel without its own regex");
  }
  add_prefix_space = level.value("add_prefix_space", false);
  pattern.emplace(split["pattern"]["Regex"].get<std::string>());
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

}  // namespace

Tokenizer Tokenizer::load(const std::string& path) {
  return from_json(read_regular_file(path, kMaxTokenizerBytes, "a tokenizer.json"), path);
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
  const Json doc = parse_untrusted_json(text, source);
  if (!doc.is_object()) throw DataError(fmt::format("{}: not a tokenizer.json object", source));
  const Json& model = doc.contains("model") ? doc["model"] : Json();
  if (!model.is_object() || model.value("type", "BPE") != "BPE" || !model.contains("vocab") ||
      !model["vocab"].is_object() || !model.contains("merges") || !model["merges"].is_array()) {
    throw DataError(fmt::format("{}: its model is not a BPE with a vocab and merges", source));
  }
  if (doc.contains("normalizer") && !doc["normalizer"].is_null()) {
    throw DataError(fmt::format("{}: normalizer {} is not supported (byte-level BPE has none)",
                                source, json_excerpt(doc["normalizer"])));
  }
  Tokenizer t;
  t.ignore_merges_ = model.value("ignore_merges", false);
  read_pre_tokenizer(doc.contains("pre_tokenizer") ? doc["pre_tokenizer"] : Json(), source,
                     t.pattern_, t.gpt2_byte_level_regex_, t.add_prefix_space_);
  const auto place = [&](std::int64_t id, const std::string& token, bool added) {
    if (id < 0 || id >= kMaxVocabulary)
      throw DataError(fmt::format("{}: token '{}' has id {} outside [0, {})", source, token, id,
                                  kMaxVocabulary));
    const auto at = static_cast<std::size_t>(id);
    if (at >= t.tokens_.size()) {
      t.tokens_.resize(at + 1);
      t.is_added_.resize(at + 1, false);
    }
    if (!t.tokens_[at].empty() && t.tokens_[at] != token)
      throw DataError(
          fmt::format("{}: id {} is both '{}' and '{}'", source, id, t.tokens_[at], token));
    t.tokens_[at] = token;
    t.is_added_[at] = t.is_added_[at] || added;
  };
  for (const auto& [token, id] : model["vocab"].items()) {
    if (!id.is_number_integer())
      throw DataError(fmt::format("{}: token '{}' has no integer id", source, token));
    place(id.get<std::int64_t>(), token, false);
    if (!t.ids_.emplace(token, id.get<std::int64_t>()).second)
      throw DataError(fmt::format("{}: token '{}' appears twice", source, token));
  }
  for (int byte = 0; byte < 256; ++byte) {
    const std::string symbol = bytes_to_symbols(std::string(1, static_cast<char>(byte)));
    const auto found = t.ids_.find(symbol);
    if (found == t.ids_.end())
      throw DataError(fmt::format("{}: the vocabulary lacks the symbol of byte {}", source, byte));
    t.byte_ids_[byte] = found->second;
  }
  for (const Json& merge : model["merges"]) {
    const auto [left, right] = merge_parts(merge, source);
    t.add_merge(left, right, source);
  }
  if (doc.contains("added_tokens") && doc["added_tokens"].is_array()) {
    for (const Json& added : doc["added_tokens"]) {
      if (!added.is_object() || !added.contains("content") || !added["content"].is_string() ||
          !added.contains("id") || !added["id"].is_number_integer() ||
          added["content"].get<std::string>().empty()) {
        throw DataError(
            fmt::format("{}: added token {} has no content or id", source, json_excerpt(added)));
      }
      AddedToken token{added["content"].get<std::string>(), added["id"].get<std::int64_t>(),
                       added.value("special", true)};
      const auto in_vocab = t.ids_.find(token.content);
      if (in_vocab == t.ids_.end() || in_vocab->second != token.id)
        place(token.id, token.content, true);
      t.added_.push_back(std::move(token));
    }
  }
  for (std::size_t id = 0; id < t.tokens_.size(); ++id) {
    if (t.tokens_[id].empty())
      throw DataError(fmt::format("{}: id {} names no token (ids must be 0 to {} without gaps)",
                                  source, id, t.tokens_.size() - 1));
  }
  // The byte tokenizer's own file (to_json() of bytes()) reads back as the byte tokenizer.
  if (t.has_byte_layout()) return Tokenizer::bytes();
  return t;
}

void Tokenizer::add_merge(const std::string& left, const std::string& right,
                          const std::string& source) {
  const auto l = ids_.find(left);
  const auto r = ids_.find(right);
  const auto m = ids_.find(left + right);
  if (l == ids_.end() || r == ids_.end() || m == ids_.end()) {
    throw DataError(
        fmt::format("{}: merge '{} {}' names a token the vocabulary lacks", source, left, right));
  }
  const auto rank = static_cast<std::int64_t>(merges_.size());
  if (merge_rank_.emplace(pair_key(l->second, r->second), rank).second) {
    merges_.emplace_back(l->second, r->second);
    merged_.push_back(m->second);
  }
}

bool Tokenizer::has_byte_layout() const {
  bool bytes =
      merges_.empty() && added_.empty() && !pattern_ && !add_prefix_space_ && vocabulary() == 256;
  for (int byte = 0; bytes && byte < 256; ++byte)
    bytes = byte_ids_[byte] == byte;
  return bytes;
}

void Tokenizer::encode_piece(std::string_view piece, std::vector<std::int64_t>& out) const {
  const std::string symbols = bytes_to_symbols(piece);
  if (ignore_merges_) {
    if (const auto whole = ids_.find(symbols); whole != ids_.end()) {
      out.push_back(whole->second);
      return;
    }
  }
  std::vector<std::int64_t> word;
  word.reserve(piece.size());
  for (const char byte : piece)
    word.push_back(byte_ids_[static_cast<unsigned char>(byte)]);
  for (;;) {
    std::int64_t best = std::numeric_limits<std::int64_t>::max();
    for (std::size_t i = 0; i + 1 < word.size(); ++i) {
      const auto found = merge_rank_.find(pair_key(word[i], word[i + 1]));
      if (found != merge_rank_.end()) best = std::min(best, found->second);
    }
    if (best == std::numeric_limits<std::int64_t>::max()) break;
    const auto [left, right] = merges_[static_cast<std::size_t>(best)];
    std::size_t kept = 0;
    for (std::size_t i = 0; i < word.size(); ++i) {
      if (i + 1 < word.size() && word[i] == left && word[i + 1] == right) {
        word[kept++] = merged_[static_cast<std::size_t>(best)];
        ++i;
      } else {
        word[kept++] = word[i];
      }
    }
    word.resize(kept);
  }
  out.insert(out.end(), word.begin(), word.end());
}

void Tokenizer::encode_ordinary(std::string_view text, std::vector<std::int64_t>& out,
                                PieceCache& cache) const {
  if (text.empty()) return;
  std::string prefixed;  // the pieces of a prefixed copy die with it: they are not cached
  if (add_prefix_space_ && text.front() != ' ') {
    prefixed = " " + std::string(text);
    text = prefixed;
  }
  if (!pattern_) {
    encode_piece(text, out);
    return;
  }
  for (const std::string_view piece : pattern_->pieces(text)) {
    if (!prefixed.empty()) {
      encode_piece(piece, out);
      continue;
    }
    auto [entry, fresh] = cache.try_emplace(piece);
    if (fresh) encode_piece(piece, entry->second);
    out.insert(out.end(), entry->second.begin(), entry->second.end());
  }
}

Tokenizer Tokenizer::bytes() {
  Tokenizer t;
  t.raw_bytes_ = true;
  for (int byte = 0; byte < 256; ++byte) {
    t.tokens_.push_back(bytes_to_symbols(std::string(1, static_cast<char>(byte))));
    t.is_added_.push_back(false);
    t.ids_.emplace(t.tokens_.back(), byte);
    t.byte_ids_[byte] = byte;
  }
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

std::vector<std::int64_t> Tokenizer::encode(std::string_view given) const {
  if (raw_bytes_) {
    std::vector<std::int64_t> ids;
    ids.reserve(given.size());
    for (const char byte : given)
      ids.push_back(static_cast<unsigned char>(byte));
    return ids;
  }
  const std::string text = valid_utf8(given);
  std::vector<std::int64_t> out;
  PieceCache cache;
  std::size_t at = 0;
  while (at < text.size()) {
    // The leftmost added token, the longest of those starting there.
    std::size_t first = std::string::npos;
    const AddedToken* match = nullptr;
    for (const AddedToken& token : added_) {
      const std::size_t found = text.find(token.content, at);
      if (found == std::string::npos) continue;
      if (found < first || (found == first && token.content.size() > match->content.size())) {
        first = found;
        match = &token;
      }
    }
    encode_ordinary(std::string_view(text).substr(at, std::min(first, text.size()) - at), out,
                    cache);
    if (match == nullptr) break;
    out.push_back(match->id);
    at = first + match->content.size();
  }
  return out;
}

std::string Tokenizer::token_bytes(std::int64_t id) const {
  if (id < 0 || id >= vocabulary()) {
    throw InvalidArgument(
        fmt::format("token id {} is outside the vocabulary of {}", id, vocabulary()));
  }
  const auto at = static_cast<std::size_t>(id);
  if (is_added_[at]) return tokens_[at];
  std::optional<std::string> bytes = symbols_to_bytes(tokens_[at]);
  return bytes ? *bytes : tokens_[at];  // a token of other symbols stands for its own text
}

std::string Tokenizer::decode(std::span<const std::int64_t> ids) const {
  std::string out;
  for (const std::int64_t id : ids)
    out += token_bytes(id);
  return out;
}

std::optional<std::int64_t> Tokenizer::token_id(std::string_view text) const {
  for (const AddedToken& token : added_)
    if (token.content == text) return token.id;
  const auto found = ids_.find(bytes_to_symbols(text));
  if (found == ids_.end()) return std::nullopt;
  return found->second;
}

std::string Tokenizer::to_json() const {
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
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", token.special}});
  }
  const Json byte_level = {{"type", "ByteLevel"},
                           {"add_prefix_space", add_prefix_space_},
                           {"trim_offsets", true},
                           {"use_regex", gpt2_byte_level_regex_}};
  Json pre_tokenizer = byte_level;
  if (pattern_ && !gpt2_byte_level_regex_) {
    pre_tokenizer = {{"type", "Sequence"},
                     {"pretokenizers",
                      {{{"type", "Split"},
                        {"pattern", {{"Regex", pattern_->pattern()}}},
                        {"behavior", "Isolated"},
                        {"invert", false}},
                       byte_level}}};
  }
  const Json doc = {{"version", "1.0"},
                    {"truncation", nullptr},
                    {"padding", nullptr},
                    {"added_tokens", added},
                    {"normalizer", nullptr},
                    {"pre_tokenizer", pre_tokenizer},
                    {"post_processor",
                     {{"type", "ByteLevel"},
                      {"add_prefix_space", true},
                      {"trim_offsets", false},
                      {"use_regex", true}}},
                    {"decoder",
                     {{"type", "ByteLevel"},
                      {"add_prefix_space", true},
                      {"trim_offsets", true},
                      {"use_regex", true}}},
                    {"model",
                     {{"type", "BPE"},
                      {"dropout", nullptr},
                      {"unk_token", nullptr},
                      {"continuing_subword_prefix", nullptr},
                      {"end_of_word_suffix", nullptr},
                      {"fuse_unk", false},
                      {"byte_fallback", false},
                      {"ignore_merges", ignore_merges_},
                      {"vocab", vocab},
                      {"merges", merges}}}};
  return doc.dump(2);
}

}  // namespace meshtensor::tokenize
