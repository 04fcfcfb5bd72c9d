#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <meshtensor/core/error.hpp>
#include <meshtensor/tokenize/added_tokens.hpp>
#include <meshtensor/tokenize/bpe_trainer.hpp>
#include <meshtensor/tokenize/byte_level.hpp>
#include <meshtensor/tokenize/tokenizer.hpp>

namespace meshtensor::tokenize {
namespace {

using Json = nlohmann::json;

/// The spans of `text` as "text" and "[content]" strings.
std::vector<std::string> shown(const AddedTokenMatcher& matcher, std::string_view text) {
  std::vector<std::string> out;
  for (const TextSpan& span : matcher.split(text)) {
    const std::string part(text.substr(span.begin, span.end - span.begin));
    out.push_back(span.token >= 0 ? "[" + part + "]" : part);
  }
  return out;
}

AddedTokenMatcher matcher_of(const std::vector<std::string>& contents) {
  std::vector<AddedToken> tokens;
  for (const std::string& content : contents)
    tokens.push_back({.content = content, .id = static_cast<std::int64_t>(tokens.size())});
  return AddedTokenMatcher(tokens);
}

/// The leftmost-longest matches a plain search finds: at each position from the last match's
/// end, every token tried; the first position with a match, its longest.
std::vector<std::string> naive(const std::vector<std::string>& tokens, std::string_view text) {
  std::vector<std::string> out;
  std::size_t covered = 0;
  for (std::size_t at = 0; at < text.size();) {
    std::size_t longest = 0;
    for (const std::string& token : tokens)
      if (text.substr(at, token.size()) == token) longest = std::max(longest, token.size());
    if (longest == 0) {
      ++at;
      continue;
    }
    if (covered < at) out.emplace_back(text.substr(covered, at - covered));
    out.push_back("[" + std::string(text.substr(at, longest)) + "]");
    at += longest;
    covered = at;
  }
  if (covered < text.size()) out.emplace_back(text.substr(covered));
  return out;
}

TEST(AddedTokens, LeftmostThenLongestAsHuggingFaceMatches) {
  const std::vector<std::string> tokens = {"ab", "abc", "bcd", "d", "<|a|>", "<|ab|>", "|"};
  const AddedTokenMatcher matcher = matcher_of(tokens);
  EXPECT_EQ(shown(matcher, "xabcdx"), (std::vector<std::string>{"x", "[abc]", "[d]", "x"}));
  EXPECT_EQ(shown(matcher, "xbcdab"), (std::vector<std::string>{"x", "[bcd]", "[ab]"}));
  EXPECT_EQ(shown(matcher, "<|ab|><|a|"),
            (std::vector<std::string>{"[<|ab|>]", "<", "[|]", "a", "[|]"}));
  // Against the plain search on texts built of the tokens' pieces.
  const std::string alphabet = "abcd<|>x";
  std::uint64_t state = 7;
  for (int round = 0; round < 300; ++round) {
    std::string text;
    for (int i = 0; i < 40; ++i) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      text += alphabet[(state >> 33) % alphabet.size()];
    }
    ASSERT_EQ(shown(matcher, text), naive(tokens, text)) << text;
  }
  EXPECT_EQ(shown(AddedTokenMatcher(), "abc"), (std::vector<std::string>{"abc"}));
}

TEST(AddedTokens, SingleWordLstripAndRstripAsHuggingFaceAppliesThem) {
  std::vector<AddedToken> tokens(3);
  tokens[0] = {.content = "<mask>", .id = 0, .lstrip = true};
  tokens[1] = {.content = "[E]", .id = 1, .rstrip = true};
  tokens[2] = {.content = "cat", .id = 2, .single_word = true};
  const AddedTokenMatcher matcher(tokens);
  EXPECT_EQ(shown(matcher, "a \t<mask> b"), (std::vector<std::string>{"a", "[ \t<mask>]", " b"}));
  EXPECT_EQ(shown(matcher, "x[E]  \ny"), (std::vector<std::string>{"x", "[[E]  \n]", "y"}));
  EXPECT_EQ(shown(matcher, "a cat."), (std::vector<std::string>{"a ", "[cat]", "."}));
  EXPECT_EQ(shown(matcher, "concat cats"), (std::vector<std::string>{"concat cats"}));
  EXPECT_EQ(shown(matcher, "é cat_"), (std::vector<std::string>{"é cat_"}));  // _ is a word char
  EXPECT_EQ(shown(matcher, "ücat"), (std::vector<std::string>{"ücat"}));      // so is ü
  // The space lstrip takes stops at the previous match.
  EXPECT_EQ(shown(matcher, "[E] <mask>"), (std::vector<std::string>{"[[E] ]", "[<mask>]"}));
  EXPECT_TRUE(is_unicode_space(0x85));
  EXPECT_TRUE(is_unicode_space(0x3000));
  EXPECT_FALSE(is_unicode_space(0x180E));  // a format character since Unicode 6.3
  EXPECT_FALSE(is_unicode_space(0x200B));
  EXPECT_TRUE(is_unicode_word(0x0301));  // a combining mark
  EXPECT_FALSE(is_unicode_word('-'));
}

/// A byte-level tokenizer.json of the 256 byte symbols, the merges `merges` (their results
/// added to the vocabulary) and `added`.
std::string tokenizer_json(const std::vector<std::pair<std::string, std::string>>& merges,
                           const Json& added) {
  Json vocab = Json::object();
  for (int b = 0; b < 256; ++b)
    vocab[bytes_to_symbols(std::string(1, static_cast<char>(b)))] = b;
  Json list = Json::array();
  for (const auto& [left, right] : merges) {
    if (!vocab.contains(left + right)) vocab[left + right] = vocab.size();
    list.push_back(Json::array({left, right}));
  }
  Json tokens = added;
  for (std::size_t i = 0; i < tokens.size(); ++i)
    tokens[i]["id"] = vocab.size() + i;
  return Json{{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", list}}},
              {"pre_tokenizer", {{"type", "ByteLevel"}, {"use_regex", true}}},
              {"added_tokens", tokens}}
      .dump();
}

TEST(Tokenizer, AddedTokenFlagsAreHonouredAndWrittenBack) {
  const Json added = Json::array(
      {{{"content", "<s>"}, {"special", true}, {"lstrip", true}, {"normalized", false}},
       {{"content", "ab"}, {"special", false}, {"normalized", true}},
       {{"content", "bc"}, {"special", true}, {"normalized", false}},
       {{"content", "dog"}, {"special", false}, {"single_word", true}, {"normalized", false}}});
  const Tokenizer t = Tokenizer::from_json(tokenizer_json({}, added), "flags");
  const std::int64_t s = 256, ab = 257, bc = 258, dog = 259;
  EXPECT_EQ(t.encode("x <s>"), (std::vector<std::int64_t>{'x', s}));
  // The tokens that are not normalized are matched first: "bc" takes "abc" before "ab" can.
  EXPECT_EQ(t.encode("abc"), (std::vector<std::int64_t>{'a', bc}));
  EXPECT_EQ(t.encode("abd"), (std::vector<std::int64_t>{ab, 'd'}));
  EXPECT_EQ(t.encode("dogs dog"), (std::vector<std::int64_t>{'d', 'o', 'g', 's', ' ', dog}));
  const Tokenizer again = Tokenizer::from_json(t.to_json(), "again");
  EXPECT_EQ(again.encode("x <s>abcdog dogs"), t.encode("x <s>abcdog dogs"));
  EXPECT_TRUE(again.added_tokens()[0].lstrip);
  EXPECT_TRUE(again.added_tokens()[3].single_word);
}

/// BPE by Hugging Face's rule, the plain way: repeatedly the lowest-ranked adjacent pair, the
/// leftmost of equals.
std::vector<std::int64_t> naive_bpe(const std::vector<std::int64_t>& bytes,
                                    const std::map<std::pair<std::int64_t, std::int64_t>,
                                                   std::pair<std::int64_t, std::int64_t>>& ranks) {
  std::vector<std::int64_t> word = bytes;
  for (;;) {
    std::size_t best = word.size();
    std::int64_t best_rank = -1;
    for (std::size_t i = 0; i + 1 < word.size(); ++i) {
      const auto found = ranks.find({word[i], word[i + 1]});
      if (found != ranks.end() && (best_rank < 0 || found->second.first < best_rank)) {
        best = i;
        best_rank = found->second.first;
      }
    }
    if (best == word.size()) return word;
    word[best] = ranks.at({word[best], word[best + 1]}).second;
    word.erase(word.begin() + static_cast<std::ptrdiff_t>(best) + 1);
  }
}

TEST(Tokenizer, LongPiecesMergeInHuggingFacesOrderInLogLinearTime) {
  BpeTrainerConfig config;
  config.vocabulary = 400;
  std::string corpus;
  for (int i = 0; i < 200; ++i)
    corpus += "the cat sat on the mat with another cat and the hat " + std::to_string(i) + "\n";
  const Tokenizer t = train_bpe(corpus, config);
  const Json doc = Json::parse(t.to_json());
  std::map<std::string, std::int64_t> ids;
  for (const auto& [symbols, id] : doc["model"]["vocab"].items())
    ids[symbols] = id.get<std::int64_t>();
  std::map<std::pair<std::int64_t, std::int64_t>, std::pair<std::int64_t, std::int64_t>> ranks;
  for (const Json& merge : doc["model"]["merges"]) {
    const std::string left = merge[0], right = merge[1];
    ranks.try_emplace({ids[left], ids[right]},
                      std::pair{static_cast<std::int64_t>(ranks.size()), ids[left + right]});
  }
  // One piece (letters only) of a few thousand bytes, checked against the plain algorithm.
  std::string word;
  std::uint64_t state = 3;
  while (word.size() < 3000) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    const std::string_view parts[] = {"the", "cat", "sat", "mat", "hat", "an", "o", "t"};
    word += parts[(state >> 33) % 8];
  }
  std::vector<std::int64_t> bytes;
  for (const char c : word)
    bytes.push_back(ids[bytes_to_symbols(std::string(1, c))]);
  EXPECT_EQ(t.encode(word), naive_bpe(bytes, ranks));
  // A piece past the chunk bound encodes in chunks of it, each as a whole piece would.
  const std::string run(Tokenizer::kMaxWordBytes + 5000, 't');
  std::vector<std::int64_t> chunked = t.encode(run.substr(0, Tokenizer::kMaxWordBytes));
  const std::vector<std::int64_t> rest = t.encode(run.substr(Tokenizer::kMaxWordBytes));
  chunked.insert(chunked.end(), rest.begin(), rest.end());
  EXPECT_EQ(t.encode(run), chunked);
  EXPECT_EQ(t.decode(t.encode(run)), run);
}

TEST(Tokenizer, NormalizersApplyBetweenTheRawAddedTokens) {
  Json doc = Json::parse(tokenizer_json(
      {}, Json::array({{{"content", "<s>"}},
                       {{"content", "\u00e9!"}, {"special", false}, {"normalized", true}}})));
  doc["normalizer"] = {{"type", "NFC"}};
  const Tokenizer nfc = Tokenizer::from_json(doc.dump(), "nfc");
  // "e" + U+0301 is "é" in NFC; the normalized added token "é!" is matched by its NFC form.
  EXPECT_EQ(nfc.encode("e\u0301x"), nfc.encode("\u00e9x"));
  EXPECT_EQ(nfc.encode("e\u0301!"), (std::vector<std::int64_t>{257}));
  EXPECT_EQ(Tokenizer::from_json(nfc.to_json(), "again").encode("e\u0301<s>"),
            nfc.encode("\u00e9<s>"));
  doc["normalizer"] = {{"type", "Sequence"},
                       {"normalizers",
                        {{{"type", "NFKC"}},
                         {{"type", "Prepend"}, {"prepend", "_"}},
                         {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "_"}}}}};
  const Tokenizer sequence = Tokenizer::from_json(doc.dump(), "sequence");
  // The normalizer runs span by span: each span between raw matches gets its own "_".
  EXPECT_EQ(sequence.decode(sequence.encode("\ufb01 x<s>y")), "_fi_x<s>_y");
  EXPECT_EQ(sequence.decode(sequence.encode("<s>")), "<s>");
  doc["normalizer"] = {{"type", "Lowercase"}};
  EXPECT_THROW(Tokenizer::from_json(doc.dump(), "lowercase"), DataError);
  doc["normalizer"] = {{"type", "Replace"}, {"pattern", {{"Regex", "\\s+"}}}, {"content", " "}};
  EXPECT_THROW(Tokenizer::from_json(doc.dump(), "regex"), DataError);
}

TEST(Tokenizer, DigitsSplitBeforeTheByteLevelPattern) {
  Json doc = Json::parse(tokenizer_json({{"1", "2"}, {"Ġ", "1"}}, Json::array()));
  doc["pre_tokenizer"] = {{"type", "Sequence"},
                          {"pretokenizers",
                           {{{"type", "Digits"}, {"individual_digits", true}},
                            {{"type", "ByteLevel"}, {"use_regex", true}}}}};
  const Tokenizer each = Tokenizer::from_json(doc.dump(), "digits");
  // Each digit is a piece of its own: "12" never merges.
  const std::int64_t twelve = 256, space_one = 257;
  EXPECT_EQ(each.encode("12"), (std::vector<std::int64_t>{'1', '2'}));
  EXPECT_EQ(each.encode("a 12"), (std::vector<std::int64_t>{'a', ' ', '1', '2'}));
  EXPECT_EQ(each.encode("\u0663"), (std::vector<std::int64_t>{0xD9, 0xA3}));  // Arabic-Indic 3
  doc["pre_tokenizer"]["pretokenizers"][0]["individual_digits"] = false;
  const Tokenizer runs = Tokenizer::from_json(doc.dump(), "runs");
  EXPECT_EQ(runs.encode("x12"), (std::vector<std::int64_t>{'x', twelve}));
  // The space before a digit stays with the text before it: " 1" is never a piece.
  EXPECT_EQ(runs.encode("x 1"), (std::vector<std::int64_t>{'x', ' ', '1'}));
  doc["pre_tokenizer"] = {{"type", "ByteLevel"}, {"use_regex", true}};
  EXPECT_EQ(Tokenizer::from_json(doc.dump(), "plain").encode("x 1"),
            (std::vector<std::int64_t>{'x', space_one}));
  EXPECT_EQ(Tokenizer::from_json(runs.to_json(), "again").encode("x12 1"), runs.encode("x12 1"));
}

TEST(Tokenizer, RefusesWhatItWouldNotComputeAndHugeIds) {
  Json doc = Json::parse(tokenizer_json({}, Json::array({{{"content", "<s>"}}})));
  const auto refusal = [](const Json& file) -> std::string {
    try {
      Tokenizer::from_json(file.dump(), "t.json");
    } catch (const DataError& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_EQ(refusal(doc), "");
  Json bad = doc;
  bad["model"]["dropout"] = 0.1;
  EXPECT_NE(refusal(bad).find("\"dropout\" is 0.1"), std::string::npos) << refusal(bad);
  bad["model"]["dropout"] = 0.0;  // no merge is skipped: the same as none
  EXPECT_EQ(refusal(bad), "");
  bad["model"]["continuing_subword_prefix"] = "##";
  EXPECT_NE(refusal(bad).find("continuing_subword_prefix"), std::string::npos);
  bad = doc;
  bad["model"]["end_of_word_suffix"] = "</w>";
  EXPECT_NE(refusal(bad).find("end_of_word_suffix"), std::string::npos);
  bad = doc;
  bad["added_tokens"] = {{"<s>", 256}};
  EXPECT_NE(refusal(bad).find("added_tokens is"), std::string::npos) << refusal(bad);
  bad = doc;
  bad["added_tokens"][0]["id"] = 16777215;  // refused before any table grows to it
  EXPECT_NE(refusal(bad).find("id 16777215, outside [0, 4353)"), std::string::npos) << refusal(bad);
  bad["added_tokens"][0]["id"] = 18446744073709551615ull;
  EXPECT_NE(refusal(bad).find("18446744073709551615"), std::string::npos) << refusal(bad);
  bad = doc;
  bad["added_tokens"][0]["lstrip"] = "yes";
  EXPECT_NE(refusal(bad).find("\"lstrip\" is \"yes\""), std::string::npos) << refusal(bad);
}

}  // namespace
}  // namespace meshtensor::tokenize
