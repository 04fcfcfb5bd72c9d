#include <algorithm>
#include <charconv>
#include <unordered_map>

#include <fmt/format.h>

#include <meshtensor/core/base64.hpp>
#include <meshtensor/core/error.hpp>
#include <meshtensor/tokenize/byte_level.hpp>
#include <meshtensor/tokenize/split_pattern.hpp>
#include <meshtensor/tokenize/tiktoken.hpp>

namespace meshtensor::tokenize {

namespace {

using Json = nlohmann::json;

constexpr std::int64_t kMaxRank = std::int64_t{1} << 24;

/// The lines of a rank file: each token's bytes, by rank.
struct Ranks {
  std::unordered_map<std::string, std::int64_t> rank;  // bytes -> rank
  std::vector<std::pair<std::int64_t, std::string>> by_rank;
};

/// One "base64 rank" line (`number` counts from 1, for errors).
void read_rank_line(std::string_view line, std::size_t number, const std::string& source,
                    Ranks& out) {
  const auto bad = [&](const std::string& why) {
    return DataError(fmt::format("{}: line {} '{}': {}", source, number,
                                 line.substr(0, std::min<std::size_t>(line.size(), 60)), why));
  };
  const std::size_t space = line.find(' ');
  if (space == std::string_view::npos || space == 0)
    throw bad("not a base64 token, a space and a rank");
  const std::string_view digits = line.substr(space + 1);
  std::int64_t rank = -1;
  const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), rank);
  if (error != std::errc() || end != digits.data() + digits.size() || digits.empty() || rank < 0 ||
      rank >= kMaxRank)
    throw bad(fmt::format("its rank is not a whole number below {}", kMaxRank));
  std::string bytes =
      base64_decode(line.substr(0, space), fmt::format("{}: line {}", source, number));
  if (bytes.empty()) throw bad("its token is empty");
  if (!out.rank.emplace(bytes, rank).second) throw bad("its token appears on an earlier line");
  out.by_rank.emplace_back(rank, std::move(bytes));
}

Ranks read_ranks(std::string_view text, const std::string& source) {
  Ranks ranks;
  std::size_t at = 0;
  for (std::size_t number = 1; at < text.size(); ++number) {
    std::size_t end = text.find('\n', at);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(at, end - at);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (!line.empty()) read_rank_line(line, number, source, ranks);
    at = end + 1;
  }
  std::sort(ranks.by_rank.begin(), ranks.by_rank.end());
  for (std::size_t i = 1; i < ranks.by_rank.size(); ++i) {
    if (ranks.by_rank[i].first == ranks.by_rank[i - 1].first)
      throw DataError(
          fmt::format("{}: rank {} is given to two tokens", source, ranks.by_rank[i].first));
  }
  if (ranks.by_rank.empty()) throw DataError(fmt::format("{}: no ranks", source));
  return ranks;
}

/// Every split of each token into two tokens, by the token's rank, then the parts' ranks: the
/// merges Hugging Face's converter writes.
Json merges_of(const Ranks& ranks) {
  Json merges = Json::array();
  std::vector<std::pair<std::pair<std::int64_t, std::int64_t>, std::size_t>> splits;
  for (const auto& [rank, token] : ranks.by_rank) {
    splits.clear();
    for (std::size_t cut = 1; cut < token.size(); ++cut) {
      const auto left = ranks.rank.find(token.substr(0, cut));
      const auto right = ranks.rank.find(token.substr(cut));
      if (left != ranks.rank.end() && right != ranks.rank.end())
        splits.push_back({{left->second, right->second}, cut});
    }
    std::sort(splits.begin(), splits.end());
    for (const auto& split : splits) {
      merges.push_back(Json::array({bytes_to_symbols(token.substr(0, split.second)),
                                    bytes_to_symbols(token.substr(split.second))}));
    }
  }
  return merges;
}

/// Llama 3's special tokens: 256 from id 128000.
std::vector<std::pair<std::string, std::int64_t>> llama3_specials() {
  std::vector<std::string> names = {"<|begin_of_text|>",
                                    "<|end_of_text|>",
                                    "<|reserved_special_token_0|>",
                                    "<|reserved_special_token_1|>",
                                    "<|finetune_right_pad_id|>",
                                    "<|reserved_special_token_2|>",
                                    "<|start_header_id|>",
                                    "<|end_header_id|>",
                                    "<|eom_id|>",
                                    "<|eot_id|>",
                                    "<|python_tag|>"};
  for (int i = 3; names.size() < 256; ++i)
    names.push_back(fmt::format("<|reserved_special_token_{}|>", i));
  std::vector<std::pair<std::string, std::int64_t>> out;
  for (std::size_t i = 0; i < names.size(); ++i)
    out.emplace_back(names[i], 128000 + static_cast<std::int64_t>(i));
  return out;
}

}  // namespace

TiktokenEncoding tiktoken_encoding(std::string_view name) {
  if (name == "cl100k_base") {
    return {std::string(kLlama3Pattern),
            {{"<|endoftext|>", 100257},
             {"<|fim_prefix|>", 100258},
             {"<|fim_middle|>", 100259},
             {"<|fim_suffix|>", 100260},
             {"<|endofprompt|>", 100276}},
            ""};
  }
  if (name == "o200k_base")
    return {
        std::string(kO200kPattern), {{"<|endoftext|>", 199999}, {"<|endofprompt|>", 200018}}, ""};
  if (name == "r50k_base" || name == "p50k_base")
    return {std::string(kGpt2Pattern), {{"<|endoftext|>", 50256}}, ""};
  if (name == "llama3")
    return {std::string(kLlama3Pattern), llama3_specials(), "<|begin_of_text|>"};
  throw InvalidArgument(fmt::format("tiktoken encoding '{}' is not one meshtensor knows ({})", name,
                                    tiktoken_encoding_names()));
}

void set_special_token(TiktokenEncoding& encoding, std::string_view spec) {
  const std::size_t equals = spec.rfind('=');
  std::int64_t id = -1;
  const std::string_view digits = equals == std::string_view::npos ? "" : spec.substr(equals + 1);
  const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), id);
  if (equals == 0 || digits.empty() || error != std::errc() ||
      end != digits.data() + digits.size() || id < 0 || id >= kMaxRank) {
    throw ParseError(fmt::format(
        "--special '{}' is not TEXT=ID (a token's text, '=', an id below {})", spec, kMaxRank));
  }
  const std::string text(spec.substr(0, equals));
  std::erase_if(encoding.specials,
                [&](const auto& special) { return special.first == text || special.second == id; });
  encoding.specials.emplace_back(text, id);
}

std::string tiktoken_encoding_names() {
  return "cl100k_base, o200k_base, r50k_base, p50k_base, llama3";
}

bool looks_like_tiktoken(std::string_view bytes) {
  const std::size_t end = std::min(bytes.find('\n'), bytes.size());
  const std::string_view line = bytes.substr(0, end);
  const std::size_t space = line.find(' ');
  if (space == std::string_view::npos || space == 0 || space + 1 >= line.size()) return false;
  const auto base64 = [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '+' || c == '/' || c == '=';
  };
  const auto digit = [](char c) { return (c >= '0' && c <= '9') || c == '\r'; };
  return std::all_of(line.begin(), line.begin() + static_cast<std::ptrdiff_t>(space), base64) &&
         std::all_of(line.begin() + static_cast<std::ptrdiff_t>(space) + 1, line.end(), digit);
}

nlohmann::json tiktoken_document(std::string_view text, const TiktokenEncoding& encoding,
                                 const std::string& source) {
  const Ranks ranks = read_ranks(text, source);
  Json vocab = Json::object();
  for (const auto& [rank, token] : ranks.by_rank)
    vocab[bytes_to_symbols(token)] = rank;
  Json added = Json::array();
  for (const auto& [content, id] : encoding.specials) {
    const auto taken =
        std::lower_bound(ranks.by_rank.begin(), ranks.by_rank.end(), id,
                         [](const auto& entry, std::int64_t rank) { return entry.first < rank; });
    if (taken != ranks.by_rank.end() && taken->first == id) {
      throw DataError(fmt::format("{}: special token {} has id {}, the rank of '{}'", source,
                                  content, id, bytes_to_symbols(taken->second)));
    }
    added.push_back({{"id", id},
                     {"content", content},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  }
  const Json byte_level = {{"type", "ByteLevel"},
                           {"add_prefix_space", false},
                           {"trim_offsets", true},
                           {"use_regex", false}};
  const Json split = {{"type", "Split"},
                      {"pattern", {{"Regex", encoding.pattern}}},
                      {"behavior", "Isolated"},
                      {"invert", false}};
  Json post = {{"type", "ByteLevel"},
               {"add_prefix_space", true},
               {"trim_offsets", false},
               {"use_regex", true}};
  if (!encoding.bos.empty()) {
    const auto bos = std::find_if(encoding.specials.begin(), encoding.specials.end(),
                                  [&](const auto& s) { return s.first == encoding.bos; });
    if (bos == encoding.specials.end())
      throw InvalidArgument(fmt::format("bos {} is not one of the special tokens", encoding.bos));
    const Json template_of = {
        {"type", "TemplateProcessing"},
        {"single",
         {{{"SpecialToken", {{"id", encoding.bos}, {"type_id", 0}}}},
          {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
        {"pair", Json::array()},
        {"special_tokens",
         {{encoding.bos,
           {{"id", encoding.bos}, {"ids", {bos->second}}, {"tokens", {encoding.bos}}}}}}};
    post = {{"type", "Sequence"}, {"processors", {post, template_of}}};
  }
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens", added},
          {"normalizer", nullptr},
          {"pre_tokenizer", {{"type", "Sequence"}, {"pretokenizers", {split, byte_level}}}},
          {"post_processor", post},
          {"decoder", byte_level},
          {"model",
           {{"type", "BPE"},
            {"dropout", nullptr},
            {"unk_token", nullptr},
            {"continuing_subword_prefix", nullptr},
            {"end_of_word_suffix", nullptr},
            {"fuse_unk", false},
            {"byte_fallback", false},
            {"ignore_merges", true},
            {"tiktoken_merges", true},
            {"vocab", vocab},
            {"merges", merges_of(ranks)}}}};
}

}  // namespace meshtensor::tokenize
