#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <meshtensor/core/error.hpp>
#include <meshtensor/core/utf8.hpp>
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

}  // namespace
}  // namespace meshtensor::tokenize
