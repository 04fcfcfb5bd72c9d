#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <meshtensor/core/error.hpp>
#include <meshtensor/core/utf8.hpp>
#include <meshtensor/tokenize/bpe_trainer.hpp>
#include <meshtensor/tokenize/byte_level.hpp>
#include <meshtensor/tokenize/split_pattern.hpp>
#include <meshtensor/tokenize/tokenizer.hpp>

namespace meshtensor::tokenize {
namespace {

TEST(ByteLevel, EveryByteHasItsOwnPrintableSymbolAndComesBack) {
  EXPECT_EQ(byte_symbol(' '), U'\u0120');  // 'Ġ'
  EXPECT_EQ(byte_symbol('A'), U'A');
  EXPECT_EQ(byte_symbol(0), U'\u0100');
  EXPECT_EQ(byte_symbol(0xAD), U'\u0143');  // the soft hyphen is not printable
  std::string all;
  for (int b = 0; b < 256; ++b)
    all += static_cast<char>(b);
  const std::string symbols = bytes_to_symbols(all);
  EXPECT_EQ(symbols_to_bytes(symbols), all);
  EXPECT_FALSE(symbols_to_bytes("\u4e2d").has_value());  // no byte's symbol
}

TEST(Utf8, InvalidBytesBecomeOneReplacementPerMaximalSubpart) {
  EXPECT_EQ(valid_utf8("ok"), "ok");
  EXPECT_EQ(valid_utf8("a\xff"
                       "b"),
            "a\uFFFD"
            "b");
  EXPECT_EQ(valid_utf8("\xe2\x82"), "\uFFFD");                  // a cut 3-byte sequence: one
  EXPECT_EQ(valid_utf8("\xed\xa0\x80"), "\uFFFD\uFFFD\uFFFD");  // a surrogate: one per byte
  EXPECT_EQ(valid_utf8("\xc0\xaf"), "\uFFFD\uFFFD");            // overlong
}

TEST(SplitPattern, PiecesCoverTheTextAndFollowGpt2sRules) {
  const SplitPattern gpt2{std::string(kGpt2Pattern)};
  const std::string text = "Hello world, it's   12 \u4e2d\u6587!\n\n";
  const std::vector<std::string_view> pieces = gpt2.pieces(text);
  std::string joined;
  for (const std::string_view piece : pieces)
    joined += piece;
  EXPECT_EQ(joined, text);
  const std::vector<std::string> expected = {"Hello", " world",        ",", " it", "'s", "  ",
                                             " 12",   " \u4e2d\u6587", "!", "\n\n"};
  ASSERT_EQ(pieces.size(), expected.size());
  for (std::size_t i = 0; i < pieces.size(); ++i)
    EXPECT_EQ(pieces[i], expected[i]) << i;
  EXPECT_THROW(SplitPattern("(unclosed"), ParseError);
}

// \s is Unicode's White_Space, as Oniguruma has it: U+180E is a format character (PCRE2's own
// \s would call it space), U+0085 and U+3000 are spaces, U+FEFF is not.
TEST(SplitPattern, SpaceIsUnicodeWhiteSpace) {
  const SplitPattern gpt2{std::string(kGpt2Pattern)};
  const auto pieces = [&](const std::string& text) {
    std::vector<std::string> out;
    for (const std::string_view piece : gpt2.pieces(text))
      out.emplace_back(piece);
    return out;
  };
  EXPECT_EQ(pieces("x\u180e'll"), (std::vector<std::string>{"x", "\u180e'", "ll"}));
  EXPECT_EQ(pieces("a\u0085b"), (std::vector<std::string>{"a", "\u0085", "b"}));
  EXPECT_EQ(pieces("a\u3000\u3000b"), (std::vector<std::string>{"a", "\u3000", "\u3000", "b"}));
  EXPECT_EQ(pieces("a\ufeffb"), (std::vector<std::string>{"a", "\ufeff", "b"}));
  // A class that holds \s, and an escaped backslash before an s, keep their meaning.
  EXPECT_EQ(SplitPattern(R"(\\s|[^\s\\]+)").pieces("ab\\s \u180e"),
            (std::vector<std::string_view>{"ab", "\\s", " ", "\u180e"}));
}

/// A tokenizer.json of the 256 byte symbols, "ab" (256), "abc" (257) and `merges`.
std::string small_tokenizer(const nlohmann::json& merges) {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b)
    vocab[bytes_to_symbols(std::string(1, static_cast<char>(b)))] = b;
  vocab["ab"] = 256;
  vocab["abc"] = 257;
  return nlohmann::json{{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}}},
                        {"pre_tokenizer", {{"type", "ByteLevel"}, {"use_regex", true}}},
                        {"added_tokens", {{{"id", 258}, {"content", "<|end|>"}}}}}
      .dump();
}

TEST(Tokenizer, MergesByRankAndRefusesBrokenFiles) {
  const Tokenizer t = Tokenizer::from_json(small_tokenizer({"a b", {"ab", "c"}}), "small");
  EXPECT_EQ(t.vocabulary(), 259);
  EXPECT_EQ(t.encode("abc"), (std::vector<std::int64_t>{257}));
  EXPECT_EQ(t.encode("abab<|end|>ca"), (std::vector<std::int64_t>{256, 256, 258, 'c', 'a'}));
  const std::vector<std::int64_t> ids = t.encode(
      "x\xff"
      "abc");  // invalid UTF-8: U+FFFD
  EXPECT_EQ(t.decode(ids), "x\uFFFDabc");
  EXPECT_EQ(Tokenizer::from_json(t.to_json(), "again").encode("abcab<|end|>"),
            t.encode("abcab<|end|>"));
  EXPECT_THROW(t.decode(std::vector<std::int64_t>{259}), InvalidArgument);
  // A merge whose result the vocabulary lacks, and one of an unknown token.
  EXPECT_THROW(Tokenizer::from_json(small_tokenizer({"b c"}), "bad"), DataError);
  EXPECT_THROW(Tokenizer::from_json(small_tokenizer({"a zz"}), "bad"), DataError);
}

TEST(Tokenizer, CyclicMergesEndAndTheBytesComeBack) {
  // "ab c" ranks before the "a b" that makes "ab", and "abc" is also reached as "a bc" through a
  // merge of its own result's parts: ranks only order the merges, so encoding ends.
  nlohmann::json doc = nlohmann::json::parse(small_tokenizer({{"ab", "c"}, "a b", "abc abc"}));
  doc["model"]["vocab"]["abcabc"] = 258;
  doc["added_tokens"][0]["id"] = 259;
  const Tokenizer t = Tokenizer::from_json(doc.dump(), "cyclic");
  const std::string text = "abcabcabcab ab c";
  const std::vector<std::int64_t> ids = t.encode(text);
  EXPECT_EQ(t.decode(ids), text);
  EXPECT_EQ(ids.front(), 258);  // "abcabc" after "ab", then "abc"
  // A merge of a token with itself whose result names a token already merged.
  EXPECT_EQ(t.encode("abcabc"), (std::vector<std::int64_t>{258}));
}

namespace trainer_check {

/// The merges a plain BPE trainer learns: recount every pair of every piece at each step.
std::vector<std::pair<std::string, std::string>> naive_merges(const std::string& text,
                                                              std::int64_t merges) {
  std::map<std::string, std::int64_t> pieces;
  for (const std::string_view piece : SplitPattern(std::string(kGpt2Pattern)).pieces(text))
    ++pieces[std::string(piece)];
  std::vector<std::pair<std::vector<std::string>, std::int64_t>> words;
  for (const auto& [piece, count] : pieces) {
    std::vector<std::string> word;
    for (const char byte : piece)
      word.push_back(bytes_to_symbols(std::string(1, byte)));
    words.emplace_back(word, count);
  }
  std::map<std::string, std::int64_t> ids;  // the trainer's ids decide ties
  for (int byte = 0; byte < 256; ++byte)
    ids[bytes_to_symbols(std::string(1, static_cast<char>(byte)))] = byte;
  std::vector<std::pair<std::string, std::string>> out;
  while (static_cast<std::int64_t>(out.size()) < merges) {
    std::map<std::pair<std::int64_t, std::int64_t>, std::int64_t> counts;
    for (const auto& [word, count] : words)
      for (std::size_t i = 0; i + 1 < word.size(); ++i)
        counts[{ids[word[i]], ids[word[i + 1]]}] += count;
    std::pair<std::int64_t, std::int64_t> best{-1, -1};
    std::int64_t best_count = 1;
    for (const auto& [pair, count] : counts) {
      if (count > best_count) {  // the map's order: the smallest pair wins a tie
        best = pair;
        best_count = count;
      }
    }
    if (best.first < 0) break;
    std::string left, right;
    for (const auto& [symbols, id] : ids) {
      if (id == best.first) left = symbols;
      if (id == best.second) right = symbols;
    }
    out.emplace_back(left, right);
    ids.try_emplace(left + right, static_cast<std::int64_t>(ids.size()));
    for (auto& [word, count] : words) {
      std::vector<std::string> merged;
      for (std::size_t i = 0; i < word.size(); ++i) {
        if (i + 1 < word.size() && word[i] == left && word[i + 1] == right) {
          merged.push_back(left + right);
          ++i;
        } else {
          merged.push_back(word[i]);
        }
      }
      word = merged;
    }
  }
  return out;
}

}  // namespace trainer_check

TEST(BpeTrainer, LearnsThePlainAlgorithmsMergesWithItsTieRule) {
  std::string text;
  for (int i = 0; i < 40; ++i)
    text += "the theme of these three thin threads; aaaa aaa bananas, Ça été été! 東京 東京\n";
  BpeTrainerConfig config;
  config.vocabulary = 256 + 60 + 1;
  BpeTrainerReport report;
  const Tokenizer tokenizer = train_bpe(text, config, &report);
  const auto doc = nlohmann::json::parse(tokenizer.to_json());
  const auto expected = trainer_check::naive_merges(text, 60);
  ASSERT_EQ(report.merges, static_cast<std::int64_t>(expected.size()));
  ASSERT_EQ(doc["model"]["merges"].size(), expected.size());
  for (std::size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(doc["model"]["merges"][i][0].get<std::string>(), expected[i].first) << "merge " << i;
    EXPECT_EQ(doc["model"]["merges"][i][1].get<std::string>(), expected[i].second) << "merge " << i;
  }
  // Ids: the bytes first, then the merges, the special token last; a text round-trips.
  EXPECT_EQ(tokenizer.token_bytes(65), "A");
  EXPECT_EQ(tokenizer.token_id("<|endoftext|>"), tokenizer.vocabulary() - 1);
  const std::string sample = "these threads<|endoftext|>東京 bananas";
  const std::vector<std::int64_t> ids = tokenizer.encode(sample);
  EXPECT_EQ(tokenizer.decode(ids), sample);
  EXPECT_LT(ids.size(), sample.size() / 2);
  // Same text, same bits.
  EXPECT_EQ(train_bpe(text, config).to_json(), tokenizer.to_json());
}

TEST(BpeTrainer, StopsWhenNoPairRepeatsAndNeverMergesAcrossSpecialTokens) {
  BpeTrainerConfig config;
  config.vocabulary = 1000;
  BpeTrainerReport report;
  const Tokenizer tokenizer = train_bpe("ab<|endoftext|>ab", config, &report);
  EXPECT_TRUE(report.exhausted);
  EXPECT_EQ(report.merges, 1);  // "ab" twice; "b<" never counted
  EXPECT_EQ(tokenizer.vocabulary(), 258);
  EXPECT_EQ(tokenizer.encode("ab").size(), 1U);
}

TEST(BpeTrainer, RefusesBadSettingsByName) {
  BpeTrainerConfig config;
  config.vocabulary = 200;
  EXPECT_THROW(
      {
        try {
          train_bpe("text", config);
        } catch (const InvalidArgument& e) {
          EXPECT_NE(std::string(e.what()).find("vocabulary 200"), std::string::npos);
          throw;
        }
      },
      InvalidArgument);
  config.vocabulary = 300;
  config.pattern = "gpt3";
  EXPECT_THROW(train_bpe("text", config), InvalidArgument);
  config.pattern = "llama3";
  config.special_tokens = {"<s>", "<s>"};
  EXPECT_THROW(train_bpe("text", config), InvalidArgument);
}

}  // namespace
}  // namespace meshtensor::tokenize
