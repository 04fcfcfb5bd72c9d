#include <algorithm>
#include <chrono>
#include <optional>
#include <queue>
#include <unordered_map>
#include <unordered_set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <meshtensor/core/error.hpp>
#include <meshtensor/core/utf8.hpp>
#include <meshtensor/tokenize/added_tokens.hpp>
#include <meshtensor/tokenize/bpe_trainer.hpp>
#include <meshtensor/tokenize/byte_level.hpp>
#include <meshtensor/tokenize/split_pattern.hpp>

namespace meshtensor::tokenize {

namespace {

using Json = nlohmann::json;
using Symbol = std::int32_t;

std::uint64_t pair_key(Symbol left, Symbol right) {
  return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(left)) << 32) |
         static_cast<std::uint32_t>(right);
}

Symbol left_of(std::uint64_t key) {
  return static_cast<Symbol>(key >> 32);
}
Symbol right_of(std::uint64_t key) {
  return static_cast<Symbol>(key & 0xFFFFFFFFu);
}

/// A pair's count as it stood when queued: larger counts first, then the smaller pair.
struct Candidate {
  std::int64_t count;
  std::uint64_t pair;
  bool operator<(const Candidate& other) const {
    return count != other.count ? count < other.count : pair > other.pair;
  }
};

/// The distinct pieces of `text` (cut at the special tokens, split by `pattern`) with how often
/// each occurs.
std::unordered_map<std::string_view, std::int64_t> count_pieces(
    std::string_view text, const SplitPattern& pattern,
    const std::vector<std::string>& special_tokens, BpeTrainerReport& report) {
  std::unordered_map<std::string_view, std::int64_t> counts;
  std::vector<AddedToken> specials;
  for (const std::string& special : special_tokens)
    specials.push_back({.content = special});
  // The specials are cut out in one pass, as encode() cuts them.
  for (const TextSpan& span : AddedTokenMatcher(specials).split(text)) {
    if (span.token >= 0) continue;
    pattern.for_each_piece(text.substr(span.begin, span.end - span.begin),
                           [&](std::string_view piece) {
                             ++counts[piece];
                             ++report.pieces;
                           });
  }
  report.distinct_pieces = static_cast<std::int64_t>(counts.size());
  return counts;
}

/// The merge state: every distinct piece as symbols, the count of every adjacent pair, and the
/// pieces where each pair was ever seen.
class MergeState {
 public:
  explicit MergeState(const std::unordered_map<std::string_view, std::int64_t>& pieces) {
    for (const auto& [piece, count] : pieces) {
      std::vector<Symbol> word;
      word.reserve(piece.size());
      for (const char byte : piece)
        word.push_back(static_cast<unsigned char>(byte));
      words_.push_back(std::move(word));
      counts_.push_back(count);
    }
    visited_.assign(words_.size(), -1);
    for (std::size_t w = 0; w < words_.size(); ++w) {
      add_pairs(w, +1);
      for (std::size_t i = 0; i + 1 < words_[w].size(); ++i)
        where_[pair_key(words_[w][i], words_[w][i + 1])].push_back(static_cast<std::int32_t>(w));
    }
    for (const auto& [pair, count] : pair_counts_)
      queue_.push({count, pair});
  }

  /// The most frequent pair now (by the tie rule), or nullopt when none occurs twice.
  std::optional<Candidate> best() {
    while (!queue_.empty()) {
      const Candidate top = queue_.top();
      const auto found = pair_counts_.find(top.pair);
      const std::int64_t now = found == pair_counts_.end() ? 0 : found->second;
      if (now == top.count) return now >= 2 ? std::optional(top) : std::nullopt;
      queue_.pop();
      if (now > 0) queue_.push({now, top.pair});
    }
    return std::nullopt;
  }

  /// Replaces every occurrence of `pair` by `merged` (the step numbered `step`).
  void merge(std::uint64_t pair, Symbol merged, std::int64_t step) {
    const Symbol left = left_of(pair);
    const Symbol right = right_of(pair);
    std::unordered_set<std::uint64_t> fresh;
    for (const std::int32_t w : where_[pair]) {
      if (visited_[static_cast<std::size_t>(w)] == step) continue;
      visited_[static_cast<std::size_t>(w)] = step;
      std::vector<Symbol>& word = words_[static_cast<std::size_t>(w)];
      add_pairs(static_cast<std::size_t>(w), -1);
      std::size_t kept = 0;
      for (std::size_t i = 0; i < word.size(); ++i) {
        if (i + 1 < word.size() && word[i] == left && word[i + 1] == right) {
          word[kept++] = merged;
          ++i;
        } else {
          word[kept++] = word[i];
        }
      }
      word.resize(kept);
      add_pairs(static_cast<std::size_t>(w), +1);
      for (std::size_t i = 0; i + 1 < word.size(); ++i) {
        if (word[i] != merged && word[i + 1] != merged) continue;
        const std::uint64_t key = pair_key(word[i], word[i + 1]);
        where_[key].push_back(w);
        fresh.insert(key);
      }
    }
    where_.erase(pair);
    std::vector<std::uint64_t> ordered(fresh.begin(), fresh.end());
    std::sort(ordered.begin(), ordered.end());
    for (const std::uint64_t key : ordered)
      queue_.push({pair_counts_[key], key});
  }

 private:
  /// Adds `sign` times the piece's count to the count of each of its adjacent pairs.
  void add_pairs(std::size_t w, int sign) {
    const std::vector<Symbol>& word = words_[w];
    for (std::size_t i = 0; i + 1 < word.size(); ++i) {
      const std::uint64_t key = pair_key(word[i], word[i + 1]);
      std::int64_t& count = pair_counts_[key];
      count += sign * counts_[w];
      if (count == 0) pair_counts_.erase(key);
    }
  }

  std::vector<std::vector<Symbol>> words_;
  std::vector<std::int64_t> counts_;
  std::vector<std::int64_t> visited_;  // the last merge step that rewrote each piece
  std::unordered_map<std::uint64_t, std::int64_t> pair_counts_;
  std::unordered_map<std::uint64_t, std::vector<std::int32_t>> where_;
  std::priority_queue<Candidate> queue_;
};

}  // namespace

void check_trainer_config(const BpeTrainerConfig& config) {
  const auto specials = static_cast<std::int64_t>(config.special_tokens.size());
  if (config.vocabulary < 256 + specials || config.vocabulary > (std::int64_t{1} << 24)) {
    throw InvalidArgument(
        fmt::format("vocabulary {} is outside [{}, {}] (256 bytes and {} special tokens)",
                    config.vocabulary, 256 + specials, std::int64_t{1} << 24, specials));
  }
  std::unordered_set<std::string> seen;
  for (const std::string& special : config.special_tokens) {
    if (special.empty()) throw InvalidArgument("a special token is empty");
    if (valid_utf8(special) != special) {
      std::string shown;
      for (const char c : special)
        shown += fmt::format("\\x{:02x}", static_cast<unsigned char>(c));
      throw InvalidArgument(
          fmt::format("special token \"{}\" is not valid UTF-8: a token is text", shown));
    }
    if (!seen.insert(special).second)
      throw InvalidArgument(fmt::format("special token '{}' is given twice", special));
  }
}

std::string_view pattern_of(const std::string& name) {
  if (name == "gpt2") return kGpt2Pattern;
  if (name == "llama3") return kLlama3Pattern;
  throw InvalidArgument(fmt::format("pre-tokenizer pattern '{}' is not gpt2 or llama3", name));
}

Tokenizer train_bpe(std::string_view text, const BpeTrainerConfig& config,
                    BpeTrainerReport* report) {
  check_trainer_config(config);
  const auto start = std::chrono::steady_clock::now();
  const SplitPattern pattern{std::string(pattern_of(config.pattern))};
  BpeTrainerReport local;
  BpeTrainerReport& out = report != nullptr ? *report : local;
  out = {};
  const std::string valid = valid_utf8(text);
  MergeState state(count_pieces(valid, pattern, config.special_tokens, out));

  std::vector<std::string> tokens;  // id -> byte symbols
  std::unordered_map<std::string, Symbol> ids;
  for (int byte = 0; byte < 256; ++byte) {
    tokens.push_back(bytes_to_symbols(std::string(1, static_cast<char>(byte))));
    ids.emplace(tokens.back(), byte);
  }
  const auto target = config.vocabulary - static_cast<std::int64_t>(config.special_tokens.size());
  Json merges = Json::array();
  while (static_cast<std::int64_t>(tokens.size()) < target) {
    const std::optional<Candidate> best = state.best();
    if (!best) {
      out.exhausted = true;
      break;
    }
    const std::string& left = tokens[static_cast<std::size_t>(left_of(best->pair))];
    const std::string& right = tokens[static_cast<std::size_t>(right_of(best->pair))];
    merges.push_back(Json::array({left, right}));
    std::string joined = left + right;
    auto [entry, fresh] = ids.try_emplace(joined, static_cast<Symbol>(tokens.size()));
    if (fresh) tokens.push_back(std::move(joined));
    state.merge(best->pair, entry->second, out.merges++);
  }
  Json vocab = Json::object();
  for (std::size_t id = 0; id < tokens.size(); ++id)
    vocab[tokens[id]] = id;
  Json added = Json::array();
  for (const std::string& special : config.special_tokens) {
    added.push_back(
        {{"id", tokens.size() + added.size()}, {"content", special}, {"special", true}});
  }
  Json pre_tokenizer = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  if (config.pattern != "gpt2") {
    pre_tokenizer = {
        {"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"},
           {"pattern", {{"Regex", std::string(pattern.pattern())}}},
           {"behavior", "Isolated"},
           {"invert", false}},
          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
  }
  const Json doc = {{"added_tokens", added},
                    {"pre_tokenizer", pre_tokenizer},
                    {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}}}};
  Tokenizer tokenizer = Tokenizer::from_json(doc.dump(), "the trained tokenizer");
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return tokenizer;
}

}  // namespace meshtensor::tokenize
