#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <meshtensor/core/base64.hpp>
#include <meshtensor/core/error.hpp>
#include <meshtensor/tokenize/tiktoken.hpp>
#include <meshtensor/tokenize/tokenizer.hpp>

namespace meshtensor::tokenize {
namespace {

using Json = nlohmann::json;
using Ids = std::vector<std::int64_t>;

/// A rank file of the 256 bytes (rank = byte) and then `tokens`, ranked in order.
std::string ranks_of(const std::vector<std::string>& tokens) {
  std::string out;
  for (int byte = 0; byte < 256; ++byte)
    out +=
        base64_encode(std::string(1, static_cast<char>(byte))) + " " + std::to_string(byte) + "\n";
  for (std::size_t i = 0; i < tokens.size(); ++i)
    out += base64_encode(tokens[i]) + " " + std::to_string(256 + i) + "\n";
  return out;
}

TiktokenEncoding plain() {
  return {"[a-z]+|[^a-z]+", {}, ""};
}

TEST(Tiktoken, TheDocumentListsEverySplitByTheRankOfItsToken) {
  const Json doc = tiktoken_document(ranks_of({"ab", "abc", "bc"}), plain(), "r");
  const Json& merges = doc["model"]["merges"];
  // "abc" (257) splits as a + bc and ab + c (bc has a higher rank, 258, but is a token): both
  // listed at abc's place, by the ranks of their parts, (97, 258) before (256, 99).
  ASSERT_EQ(merges.size(), 4u);
  EXPECT_EQ(merges[0], Json::array({"a", "b"}));
  EXPECT_EQ(merges[1], Json::array({"a", "bc"}));
  EXPECT_EQ(merges[2], Json::array({"ab", "c"}));
  EXPECT_EQ(merges[3], Json::array({"b", "c"}));
  EXPECT_TRUE(doc["model"]["ignore_merges"].get<bool>());
  EXPECT_TRUE(doc["model"]["tiktoken_merges"].get<bool>());
}

// tiktoken merges the pair that makes the lowest-ranked token; Hugging Face's BPE the pair whose
// merge comes first in the list. A list whose merges of one token are apart tells them apart.
TEST(Tiktoken, TiktokenMergesRankAPairByTheTokenItMakes) {
  Json doc = tiktoken_document(ranks_of({"aa", "aaa", "ab"}), plain(), "r");
  doc["model"]["merges"] = Json::array({Json::array({"a", "a"}), Json::array({"a", "aa"}),
                                        Json::array({"a", "b"}), Json::array({"aa", "a"})});
  const auto id = [&](const char* token) {
    return doc["model"]["vocab"][token].get<std::int64_t>();
  };
  const Tokenizer tiktoken = Tokenizer::from_json(doc.dump(), "t");
  EXPECT_EQ(tiktoken.encode("aaaba"), (Ids{id("aaa"), id("b"), id("a")}));
  doc["model"]["tiktoken_merges"] = false;
  const Tokenizer listed = Tokenizer::from_json(doc.dump(), "t");
  EXPECT_EQ(listed.encode("aaaba"), (Ids{id("aa"), id("ab"), id("a")}));
  // The rule is kept in the file meshtensor writes.
  EXPECT_EQ(Tokenizer::from_json(tiktoken.to_json(), "t").encode("aaaba"),
            tiktoken.encode("aaaba"));
}

TEST(Tiktoken, SpecialTokensMayLeaveIdsUnusedThatDecodeToNothing) {
  TiktokenEncoding encoding = plain();
  set_special_token(encoding, "<|end|>=300");
  const Tokenizer t = Tokenizer::from_tiktoken(ranks_of({"ab"}), encoding, "r");
  EXPECT_EQ(t.vocabulary(), 301);
  EXPECT_EQ(t.encode("ab<|end|>"), (Ids{256, 300}));
  EXPECT_EQ(t.decode(Ids{97, 280, 300}), "a<|end|>");
  set_special_token(encoding, "<|end|>=290");  // the same text: replaced
  ASSERT_EQ(encoding.specials.size(), 1u);
  EXPECT_EQ(encoding.specials[0].second, 290);
}

TEST(Tiktoken, MalformedInputIsRefusedByName) {
  TiktokenEncoding encoding = plain();
  for (const char* spec : {"x", "=5", "x=", "x=-1", "x=5y", "x=99999999999"})
    EXPECT_THROW(set_special_token(encoding, spec), ParseError) << spec;
  EXPECT_THROW(tiktoken_encoding("gpt5"), InvalidArgument);
  EXPECT_EQ(tiktoken_encoding("llama3").specials.size(), 256u);
  EXPECT_EQ(tiktoken_encoding("llama3").specials[9].first, "<|eot_id|>");
  const auto refusal = [](const std::string& ranks) {
    try {
      tiktoken_document(ranks, plain(), "r");
    } catch (const DataError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(refusal("YQ== 0\nYQ== 1\n").find("line 2 'YQ== 1': its token appears"),
            std::string::npos);
  EXPECT_NE(refusal("YQ== 0\nYg== 0\n").find("rank 0 is given to two tokens"), std::string::npos);
  EXPECT_NE(refusal("YQ==0\n").find("line 1"), std::string::npos);
  EXPECT_NE(refusal("\n\n").find("no ranks"), std::string::npos);
  EXPECT_TRUE(looks_like_tiktoken("IQ== 0\nIg== 1\n"));
  EXPECT_FALSE(looks_like_tiktoken("{\"model\": 1}"));
  EXPECT_FALSE(looks_like_tiktoken("\n\x0a\x05hello"));
}

}  // namespace
}  // namespace meshtensor::tokenize
