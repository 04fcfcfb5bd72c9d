#include "hf/tokenizer_config.hpp"

#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <meshtensor/core/base64.hpp>
#include <meshtensor/core/error.hpp>
#include <meshtensor/tokenize/tiktoken.hpp>
#include <meshtensor/tokenize/tokenizer.hpp>

namespace meshtensor::hf {
namespace {

using Json = nlohmann::json;
using Ids = std::vector<std::int64_t>;

/// A byte-level tokenizer of the 256 bytes with <s> (256), </s> (257) and <eot> (258).
tokenize::Tokenizer tokenizer() {
  std::string ranks;
  for (int byte = 0; byte < 256; ++byte)
    ranks +=
        base64_encode(std::string(1, static_cast<char>(byte))) + " " + std::to_string(byte) + "\n";
  return tokenize::Tokenizer::from_tiktoken(
      ranks, {"[a-z]+|[^a-z]+", {{"<s>", 256}, {"</s>", 257}, {"<eot>", 258}}, ""}, "ranks");
}

tokenize::Tokenizer configured(const Json& tokenizer_config, const Json& generation_config,
                               const Json& model_config = Json::object()) {
  tokenize::Tokenizer t = tokenizer();
  apply_tokenizer_configs(t, tokenizer_config, "tokenizer_config.json", generation_config,
                          "generation_config.json", model_config, "config.json");
  return t;
}

std::string refusal(const Json& tokenizer_config, const Json& generation_config) {
  try {
    configured(tokenizer_config, generation_config);
  } catch (const DataError& e) {
    return e.what();
  }
  return "";
}

TEST(TokenizerConfig, AddBosAndEosPutTheTokensAroundAText) {
  const Json config = {{"bos_token", "<s>"},
                       {"eos_token", {{"content", "</s>"}, {"special", true}}},
                       {"add_bos_token", true},
                       {"add_eos_token", true}};
  const tokenize::Tokenizer t = configured(config, nullptr);
  EXPECT_EQ(t.encode_with_specials("ab"), (Ids{256, 97, 98, 257}));
  EXPECT_EQ(t.encode("ab"), (Ids{97, 98}));
  EXPECT_EQ(t.roles().bos_token, "<s>");
  EXPECT_EQ(t.roles().end_ids, (Ids{257}));  // the tokenizer's eos ends a generation
  Json no_bos = config;
  no_bos["add_bos_token"] = false;
  EXPECT_EQ(configured(no_bos, nullptr).encode_with_specials("ab"), (Ids{97, 98, 257}));
}

TEST(TokenizerConfig, EndIdsComeFromGenerationConfigThenConfigJsonThenTheEosToken) {
  const Json eos = {{"eos_token", "</s>"}};
  EXPECT_EQ(configured(eos, {{"eos_token_id", Json::array({258, 257})}}).roles().end_ids,
            (Ids{258, 257}));
  EXPECT_EQ(configured(eos, {{"eos_token_id", 258}}).roles().end_ids, (Ids{258, 257}));
  // config.json counts only where the folder has no generation_config.json.
  EXPECT_EQ(configured(eos, nullptr, {{"eos_token_id", 258}}).roles().end_ids, (Ids{258, 257}));
  EXPECT_EQ(configured(eos, {{"eos_token_id", nullptr}}, {{"eos_token_id", 258}}).roles().end_ids,
            (Ids{257}));
  EXPECT_EQ(configured(nullptr, nullptr).roles(), tokenize::SpecialRoles{});
}

TEST(TokenizerConfig, TheRolesTravelWithTheTokenizerAndExportBack) {
  const tokenize::Tokenizer t =
      configured({{"bos_token", "<s>"}, {"add_bos_token", true}, {"pad_token", "<eot>"}},
                 {{"eos_token_id", Json::array({257, 258})}});
  const tokenize::Tokenizer back = tokenize::Tokenizer::from_json(t.to_json(), "t");
  EXPECT_EQ(back.roles(), t.roles());
  EXPECT_EQ(back.encode_with_specials("a"), (Ids{256, 97}));
  EXPECT_EQ(Json::parse(t.to_hugging_face_json()).count("special_roles"), 0u);
  const Json written = tokenizer_config_json(t, 64);
  EXPECT_EQ(written["bos_token"], "<s>");
  EXPECT_EQ(written["pad_token"], "<eot>");
  EXPECT_EQ(written["add_bos_token"], true);
  EXPECT_EQ(written["add_eos_token"], false);
  EXPECT_EQ(written["added_tokens_decoder"]["258"]["content"], "<eot>");
  const Json generation = generation_config_json(t, 64);
  EXPECT_EQ(generation["eos_token_id"], Json::array({257, 258}));
  EXPECT_EQ(generation["bos_token_id"], 256);
  // Read back, the written configs give the same roles and template.
  const tokenize::Tokenizer again = configured(written, generation);
  EXPECT_EQ(again.roles(), t.roles());
  EXPECT_EQ(again.encode_with_specials("a"), t.encode_with_specials("a"));
}

TEST(TokenizerConfig, TheChatTemplateTravelsWithTheTokenizer) {
  const std::string chat = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}";
  const tokenize::Tokenizer t = configured({{"chat_template", chat}}, nullptr);
  EXPECT_EQ(t.chat_template(), chat);
  EXPECT_EQ(tokenize::Tokenizer::from_json(t.to_json(), "t").chat_template(), chat);
  EXPECT_EQ(Json::parse(t.to_hugging_face_json()).count("chat_template"), 0u);
  EXPECT_EQ(tokenizer_config_json(t, 8)["chat_template"], chat);
  // A list of named templates: the default one.
  const Json named = Json::array(
      {{{"name", "tool_use"}, {"template", "x"}}, {{"name", "default"}, {"template", chat}}});
  EXPECT_EQ(configured({{"chat_template", named}}, nullptr).chat_template(), chat);
  // A template meshtensor cannot render still loads: it is refused only when a chat renders.
  const std::string macro = "{% macro m() %}{% endmacro %}";
  EXPECT_EQ(configured({{"chat_template", macro}}, nullptr).chat_template(), macro);
  EXPECT_NE(refusal({{"chat_template", 5}}, nullptr).find("\"chat_template\" is 5"),
            std::string::npos);
}

TEST(TokenizerConfig, AddedTokensDecoderMarksSpecialTokensByTheirIds) {
  const Json decoder = {{"258", {{"content", "<eot>"}, {"special", false}}}};
  const tokenize::Tokenizer t = configured({{"added_tokens_decoder", decoder}}, nullptr);
  EXPECT_EQ(t.decode_text(Ids{97, 258}, true), "a<eot>");  // no longer skipped as special
  EXPECT_EQ(t.decode_text(Ids{97, 257}, true), "a");
  EXPECT_NE(refusal({{"added_tokens_decoder", {{"257", {{"content", "<eot>"}}}}}}, nullptr)
                .find("gives id 257 to '<eot>', which the tokenizer has as id 258"),
            std::string::npos);
  EXPECT_NE(refusal({{"added_tokens_decoder", {{"x", {{"content", "<eot>"}}}}}}, nullptr)
                .find("\"x\" is not an id"),
            std::string::npos);
}

TEST(TokenizerConfig, BadFieldsAreRefusedNamingTheFileAndTheField) {
  EXPECT_NE(refusal({{"add_bos_token", true}}, nullptr).find("names no bos_token"),
            std::string::npos);
  EXPECT_NE(refusal({{"eos_token", "<nope>"}}, nullptr)
                .find("tokenizer_config.json: eos_token '<nope>' is not in the tokenizer"),
            std::string::npos);
  EXPECT_NE(refusal({{"bos_token", 5}}, nullptr).find("\"bos_token\" is 5, not a token"),
            std::string::npos);
  EXPECT_NE(refusal(nullptr, {{"eos_token_id", Json::array({1, 259})}})
                .find("generation_config.json: end-of-sequence id 259 names no token"),
            std::string::npos);
  EXPECT_NE(refusal(nullptr, {{"eos_token_id", Json::array({1.5})}}).find("not an id or a list"),
            std::string::npos);
}

}  // namespace
}  // namespace meshtensor::hf
