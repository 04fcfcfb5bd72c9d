#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <meshtensor/core/error.hpp>
#include <meshtensor/tokenize/decoder.hpp>
#include <meshtensor/tokenize/post_processor.hpp>
#include <meshtensor/tokenize/pre_tokenizer.hpp>

namespace meshtensor::tokenize {
namespace {

using Json = nlohmann::json;

std::vector<std::string> pieces(const PreTokenizer& pre, std::string_view text,
                                bool at_start = true) {
  std::vector<std::string> out;
  pre.for_each_piece(text, at_start, [&](std::string_view piece) { out.emplace_back(piece); });
  return out;
}

PreTokenizer split(const std::string& behavior, const Json& pattern = {{"String", "-"}}) {
  return PreTokenizer::from_json(
      {{"type", "Split"}, {"pattern", pattern}, {"behavior", behavior}, {"invert", false}}, "t");
}

using Pieces = std::vector<std::string>;

// Hugging Face's documented example of each SplitDelimiterBehavior.
TEST(PreTokenizer, SplitBehavioursCutAsHuggingFaceDocuments) {
  const std::string text = "the-final--countdown";
  EXPECT_EQ(pieces(split("Removed"), text), (Pieces{"the", "final", "countdown"}));
  EXPECT_EQ(pieces(split("Isolated"), text), (Pieces{"the", "-", "final", "-", "-", "countdown"}));
  EXPECT_EQ(pieces(split("MergedWithPrevious"), text),
            (Pieces{"the-", "final-", "-", "countdown"}));
  EXPECT_EQ(pieces(split("MergedWithNext"), text), (Pieces{"the", "-final", "-", "-countdown"}));
  EXPECT_EQ(pieces(split("Isolated", {{"Regex", "-+"}}), text),
            (Pieces{"the", "-", "final", "--", "countdown"}));
  // A String pattern is literal: "." is a dot, not any character.
  EXPECT_EQ(pieces(split("Removed", {{"String", "."}}), "a.b"), (Pieces{"a", "b"}));
}

TEST(PreTokenizer, MetaspaceReplacesSpacesPrependsAndSplits) {
  const auto meta = [](const std::string& scheme, bool split_pieces) {
    return PreTokenizer::from_json({{"type", "Metaspace"},
                                    {"replacement", "\u2581"},
                                    {"prepend_scheme", scheme},
                                    {"split", split_pieces}},
                                   "t");
  };
  EXPECT_EQ(pieces(meta("always", true), "Hey  friend"),
            (Pieces{"\u2581Hey", "\u2581", "\u2581friend"}));
  EXPECT_EQ(pieces(meta("always", false), "Hey friend"), (Pieces{"\u2581Hey\u2581friend"}));
  // "first" prepends only at the start of the input; no text gets a second one.
  EXPECT_EQ(pieces(meta("first", false), "Hey", false), (Pieces{"Hey"}));
  EXPECT_EQ(pieces(meta("first", false), "Hey", true), (Pieces{"\u2581Hey"}));
  EXPECT_EQ(pieces(meta("always", false), " Hey"), (Pieces{"\u2581Hey"}));
  EXPECT_EQ(pieces(meta("never", false), "Hey you"), (Pieces{"Hey\u2581you"}));
  // The older form: add_prefix_space instead of a prepend_scheme.
  EXPECT_EQ(
      pieces(PreTokenizer::from_json({{"type", "Metaspace"}, {"add_prefix_space", false}}, "t"),
             "a b"),
      (Pieces{"a", "\u2581b"}));
}

TEST(PreTokenizer, RefusesWhatItDoesNotCompute) {
  EXPECT_THROW(PreTokenizer::from_json({{"type", "Whitespace"}}, "t"), DataError);
  EXPECT_THROW(split("Contiguous"), DataError);
  EXPECT_THROW(PreTokenizer::from_json({{"type", "Split"},
                                        {"pattern", {{"String", "-"}}},
                                        {"behavior", "Isolated"},
                                        {"invert", true}},
                                       "t"),
               DataError);
  // A part after a ByteLevel would see its byte symbols.
  EXPECT_THROW(
      PreTokenizer::from_json({{"type", "Sequence"},
                               {"pretokenizers", {{{"type", "ByteLevel"}}, {{"type", "Digits"}}}}},
                              "t"),
      DataError);
}

TEST(Decoder, LlamaSequenceGivesBytesAndStripsTheFirstSpace) {
  const Decoder decoder = Decoder::from_json(
      {{"type", "Sequence"},
       {"decoders",
        {{{"type", "Replace"}, {"pattern", {{"String", "\u2581"}}}, {"content", " "}},
         {{"type", "ByteFallback"}},
         {{"type", "Fuse"}},
         {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}},
      "t");
  EXPECT_EQ(decoder.entry_bytes("\u2581Hello"), " Hello");
  EXPECT_EQ(decoder.entry_bytes("<0xC3>"), "\xC3");
  EXPECT_EQ(decoder.entry_bytes("<0xzz>"), "<0xzz>");
  std::string text = "  two spaces";
  decoder.strip(text);
  EXPECT_EQ(text, " two spaces");
  EXPECT_EQ(Decoder::from_json(decoder.to_json(), "t").to_json(), decoder.to_json());
  EXPECT_THROW(Decoder::from_json({{"type", "WordPiece"}}, "t"), DataError);
  EXPECT_THROW(Decoder::from_json({{"type", "Strip"}, {"content", " "}, {"start", 1}}, "t"),
               DataError);  // before a Fuse it would strip every token
}

TEST(PostProcessor, TemplatesAddTheirSpecialTokens) {
  const Json llama3 = {
      {"type", "Sequence"},
      {"processors",
       {{{"type", "ByteLevel"}},
        {{"type", "TemplateProcessing"},
         {"single",
          {{{"SpecialToken", {{"id", "<|begin_of_text|>"}, {"type_id", 0}}}},
           {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
         {"special_tokens",
          {{"<|begin_of_text|>", {{"id", "<|begin_of_text|>"}, {"ids", {128000}}}}}}}}}};
  const PostProcessor post = PostProcessor::from_json(llama3, "t");
  EXPECT_EQ(post.before(), (std::vector<std::int64_t>{128000}));
  EXPECT_TRUE(post.after().empty());
  const std::vector<std::int64_t> ids{128000, 5, 6};
  EXPECT_EQ(post.inner(ids).size(), 2u);
  const PostProcessor bert = PostProcessor::from_json(
      {{"type", "BertProcessing"}, {"cls", {"[CLS]", 101}}, {"sep", {"[SEP]", 102}}}, "t");
  EXPECT_EQ(bert.before(), (std::vector<std::int64_t>{101}));
  EXPECT_EQ(bert.after(), (std::vector<std::int64_t>{102}));
  const PostProcessor made = PostProcessor::around({1}, {2}, {"<s>"}, {"</s>"});
  const PostProcessor read = PostProcessor::from_json(made.to_json(false), "t");
  EXPECT_EQ(read.before(), made.before());
  EXPECT_EQ(read.after(), made.after());
  EXPECT_THROW(
      PostProcessor::from_json({{"type", "TemplateProcessing"}, {"single", Json::array()}}, "t"),
      DataError);
}

}  // namespace
}  // namespace meshtensor::tokenize
