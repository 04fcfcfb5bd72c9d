#include <bit>

#include <gtest/gtest.h>

#include <meshtensor/serve/api.hpp>
#include <meshtensor/tokenize/bpe_trainer.hpp>

#include "support/tiny_gpt.hpp"

namespace meshtensor::serve {
namespace {

nn::GptConfig config() {
  return testing::tiny_gpt({.layers = 1, .dim = 8, .context = 32});
}

CompletionParams parse(const std::string& body) {
  return parse_completion_request(
      body, "m", config(),
      std::make_shared<const tokenize::Tokenizer>(tokenize::Tokenizer::bytes()), ApiLimits{}, 99);
}

TEST(Api, PromptsComeAsTextListsOrTokenIds) {
  EXPECT_EQ(parse(R"({"prompt":"ab"})").prompts,
            (std::vector<std::vector<std::int64_t>>{{97, 98}}));
  EXPECT_EQ(parse(R"({"prompt":["a","bc"]})").prompts.size(), 2u);
  EXPECT_EQ(parse(R"({"prompt":[1,2,3]})").prompts,
            (std::vector<std::vector<std::int64_t>>{{1, 2, 3}}));
  EXPECT_EQ(parse(R"({"prompt":[[1],[2,3]]})").prompts,
            (std::vector<std::vector<std::int64_t>>{{1}, {2, 3}}));
}

TEST(Api, DefaultsFollowOpenAI) {
  const CompletionParams p = parse(R"({"model":"m","prompt":"abc"})");
  EXPECT_EQ(p.max_tokens, 16);
  EXPECT_EQ(p.sampling.temperature, 1.0);
  EXPECT_EQ(p.sampling.top_p, 1.0);
  EXPECT_EQ(p.sampling.seed, 99u);
  EXPECT_FALSE(p.seed_given);
  EXPECT_EQ(p.n, 1);
  EXPECT_FALSE(p.logprobs.has_value());
  // Without max_tokens, a long prompt gets what is left of the context.
  EXPECT_EQ(parse(R"({"prompt":")" + std::string(25, 'x') + R"("})").max_tokens, 7);
  const CompletionParams q = parse(
      R"({"prompt":"a","seed":-1,"top_k":-1,"stop":"x","logprobs":3,"echo":true,"stream":true,
          "stream_options":{"include_usage":true},"n":2,"best_of":2,"user":"u","suffix":null,
          "presence_penalty":0,"frequency_penalty":0.0,"logit_bias":{},"max_tokens":null})");
  EXPECT_EQ(q.sampling.seed, ~std::uint64_t{0});
  EXPECT_TRUE(q.seed_given);
  EXPECT_EQ(q.sampling.top_k, 0);
  EXPECT_EQ(q.stop, std::vector<std::string>{"x"});
  EXPECT_EQ(q.logprobs, 3);
  EXPECT_TRUE(q.echo && q.stream && q.include_usage);
}

/// Each bad request: its status, the field named, and a word of the message.
TEST(Api, BadRequestsNameTheFieldAndTheValue) {
  struct Case {
    std::string body;
    int status;
    std::string param;
    std::string word;
  };
  const std::vector<Case> cases{
      {R"({"prompt":)", 400, "", "not valid JSON"},
      {R"([1,2])", 400, "", "JSON object"},
      {std::string(100, '[') + std::string(100, ']'), 400, "", "deeper"},
      {R"({"prompt":"a","max_tokenz":1})", 400, "max_tokenz", "max_tokenz"},
      {R"({})", 400, "prompt", "required"},
      {R"({"prompt":""})", 400, "prompt", "empty"},
      {R"({"prompt":[]})", 400, "prompt", "must be"},
      {R"({"prompt":[1,"a"]})", 400, "prompt", "item 1"},
      {R"({"prompt":[300]})", 400, "prompt[0]", "300"},
      {R"({"prompt":")" + std::string(32, 'x') + R"("})", 400, "prompt", "context is 32"},
      {R"({"prompt":"a","max_tokens":0})", 400, "max_tokens", "0 is less than 1"},
      {R"({"prompt":"a","max_tokens":-3})", 400, "max_tokens", "-3"},
      {R"({"prompt":"a","max_tokens":1e300})", 400, "max_tokens", "integer"},
      {R"({"prompt":"a","max_tokens":18446744073709551615})", 400, "max_tokens", "more than"},
      {R"({"prompt":"a","max_tokens":40})", 400, "max_tokens", "context of 32"},
      {R"({"prompt":"a","max_tokens":2.5})", 400, "max_tokens", "integer"},
      {R"({"prompt":"a","max_tokens":"5"})", 400, "max_tokens", "integer"},
      {R"({"prompt":"a","temperature":3})", 400, "temperature", "between 0 and 2"},
      {R"({"prompt":"a","temperature":"hot"})", 400, "temperature", "\"hot\""},
      {R"({"prompt":"a","top_p":1.5})", 400, "top_p", "1.5"},
      {R"({"prompt":"a","top_k":-2})", 400, "top_k", "-2"},
      {R"({"prompt":"a","n":0})", 400, "n", "0 is less than 1"},
      {R"({"prompt":"a","n":1000000})", 400, "n", "1000000"},
      {R"({"prompt":["a","b","c"],"n":30})", 400, "n", "90 choices"},
      {R"({"prompt":"a","stop":["","x"]})", 400, "stop", "empty"},
      {R"({"prompt":"a","stop":["a","b","c","d","e"]})", 400, "stop", "5 sequences"},
      {R"({"prompt":"a","stop":7})", 400, "stop", "string"},
      {R"({"prompt":"a","logprobs":21})", 400, "logprobs", "21"},
      {R"({"prompt":"a","logprobs":true})", 400, "logprobs", "integer"},
      {R"({"prompt":"a","stream":"yes"})", 400, "stream", "true or false"},
      {R"({"prompt":"a","stream_options":{"x":1}})", 400, "stream_options", "'x'"},
      {R"({"prompt":"a","seed":1.5})", 400, "seed", "integer"},
      {R"({"prompt":"a","presence_penalty":0.5})", 400, "presence_penalty", "not supported"},
      {R"({"prompt":"a","best_of":3})", 400, "best_of", "not supported"},
      {R"({"prompt":"a","logit_bias":{"1":2}})", 400, "logit_bias", "not supported"},
      {R"({"prompt":"a","suffix":"z"})", 400, "suffix", "not supported"},
      {R"({"prompt":"a","model":7})", 400, "model", "string"},
      {R"({"prompt":"a","model":"gpt-4"})", 404, "model", "gpt-4"},
      // A number no double holds is the client's error, naming its field (never a 5xx).
      {R"({"prompt":"a","max_tokens":1e999})", 400, "max_tokens", "number overflow"},
      {R"({"temperature":-1e400,"prompt":"a"})", 400, "temperature", "not a number the server"},
  };
  for (const Case& c : cases) {
    try {
      parse(c.body);
      ADD_FAILURE() << "accepted " << c.body.substr(0, 80);
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, c.status) << c.body.substr(0, 80);
      EXPECT_EQ(e.param, c.param) << c.body.substr(0, 80) << ": " << e.message;
      EXPECT_NE(e.message.find(c.word), std::string::npos)
          << c.body.substr(0, 80) << ": " << e.message;
      const Json body = error_body(e);
      EXPECT_EQ(body["error"]["message"], e.message);
      EXPECT_TRUE(body["error"].contains("type") && body["error"].contains("code"));
    }
  }
}

std::vector<generate::ScoredToken> scored(const std::string& text) {
  std::vector<generate::ScoredToken> out;
  for (const char c : text)
    out.push_back({static_cast<unsigned char>(c), -1.0, {}});
  return out;
}

TEST(Api, StopSequencesCutTheTextAndStreamsHoldBackWhatMayBecomeOne) {
  const tokenize::Tokenizer bytes = tokenize::Tokenizer::bytes();
  EXPECT_EQ(stop_cut(scored("hello wor"), {"world"}, bytes), std::nullopt);
  EXPECT_EQ(stop_cut(scored("hello world"), {"world", "xyz"}, bytes), (StopCut{6, 6}));
  EXPECT_EQ(stop_cut(scored("abc\n"), {"\n"}, bytes), (StopCut{3, 3}));
  // "wor" could still become "world": held back; "worx" cannot.
  EXPECT_EQ(streamable_tokens(scored("hello wor"), {"world"}, bytes), 6u);
  EXPECT_EQ(streamable_tokens(scored("hello worx"), {"world"}, bytes), 10u);
  // An unfinished UTF-8 character waits for its last byte.
  EXPECT_EQ(streamable_tokens(scored("ab\xe2\x82"), {}, bytes), 2u);
  EXPECT_EQ(streamable_tokens(scored("ab\xe2\x82\xac"), {}, bytes), 5u);
  EXPECT_EQ(streamable_tokens(scored("ab\xc3"), {}, bytes), 2u);
}

/// A BPE with multi-byte tokens for "hello world".
tokenize::Tokenizer multi_byte_tokenizer() {
  tokenize::BpeTrainerConfig config;
  config.vocabulary = 400;
  std::string text;
  for (int i = 0; i < 50; ++i)
    text += "hello world \xe2\x82\xac ";
  return tokenize::train_bpe(text, config);
}

std::vector<generate::ScoredToken> scored_ids(const std::vector<std::int64_t>& ids) {
  std::vector<generate::ScoredToken> out;
  for (const std::int64_t id : ids)
    out.push_back({id, -1.0, {}});
  return out;
}

TEST(Api, StopSequencesAndStreamsWorkOnTheTextOfMultiByteTokens) {
  const tokenize::Tokenizer bpe = multi_byte_tokenizer();
  const std::vector<std::int64_t> ids = bpe.encode("hello world");
  ASSERT_LT(ids.size(), 4u);
  // A stop sequence that starts inside a token: the text ends before it, the token stays.
  const auto cut = stop_cut(scored_ids(ids), {"o w"}, bpe);
  ASSERT_TRUE(cut.has_value());
  EXPECT_EQ(cut->text_bytes, 4u);  // "hell"
  EXPECT_EQ(bpe.decode(std::vector<std::int64_t>(ids.begin(), ids.begin() + cut->tokens))
                .substr(0, cut->text_bytes),
            "hell");
  // A sequence that ended before the last token was found then, not now.
  std::vector<std::int64_t> more = ids;
  more.push_back(bpe.encode(" ").front());
  EXPECT_EQ(stop_cut(scored_ids(more), {"hello"}, bpe), std::nullopt);
  // The tokens whose text could still begin the stop sequence wait whole.
  const std::vector<std::int64_t> wor = bpe.encode("hello wo");
  EXPECT_EQ(streamable_tokens(scored_ids(wor), {"world"}, bpe), bpe.encode("hello").size());
  // A token of part of a character waits for the rest.
  std::vector<std::int64_t> partial = bpe.encode("hello");
  partial.push_back(0xe2);  // ids 0-255 are the bytes
  EXPECT_EQ(streamable_tokens(scored_ids(partial), {}, bpe), partial.size() - 1);
  partial.push_back(0x82);
  partial.push_back(0xac);
  EXPECT_EQ(streamable_tokens(scored_ids(partial), {}, bpe), partial.size());
}

TEST(Api, ResponsesHaveOpenAIsShapeAndTheLogprobBits) {
  CompletionParams params = parse(R"({"prompt":"hi","logprobs":1,"echo":true,"n":1})");
  ChoiceResult choice;
  choice.prompt = params.prompts[0];
  choice.prompt_scores = {{'i', -0.5, {{'i', -0.5}}}};
  const double bits = std::bit_cast<double>(std::uint64_t{0xbfe5555555555555});
  choice.tokens = {{0xe2, bits, {{0xe2, bits}}}, {'!', -2.0, {{'x', -1.0}}}};
  choice.finish_reason = "length";
  const ResponseHeader header{"cmpl-1", 5, "m", 12, 99};
  const Json r = Json::parse(dump(completion_response(header, params, {choice})));
  EXPECT_EQ(r["object"], "text_completion");
  EXPECT_EQ(r["weights_step"], 12);
  EXPECT_EQ(r["usage"]["total_tokens"], 4);
  const Json& c = r["choices"][0];
  EXPECT_EQ(c["text"], "hi\xef\xbf\xbd!");  // the lone byte 0xe2 is not UTF-8
  EXPECT_EQ(c["token_ids"], Json::array({0xe2, '!'}));
  EXPECT_EQ(c["logprobs"]["tokens"], Json::array({"h", "i", "bytes:\\xe2", "!"}));
  EXPECT_TRUE(c["logprobs"]["token_logprobs"][0].is_null());
  EXPECT_EQ(std::bit_cast<std::uint64_t>(c["logprobs"]["token_logprobs"][2].get<double>()),
            std::uint64_t{0xbfe5555555555555});
  EXPECT_EQ(c["logprobs"]["top_logprobs"][3]["x"], -1.0);
  const Json chunk = completion_chunk(header, params, 0, choice, 1, 2, false, true);
  EXPECT_EQ(chunk["choices"][0]["text"], "!");
  EXPECT_EQ(chunk["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(ChunkWriter(header).chunk(params, 0, choice, 1, 2, false, true), dump(chunk));
  EXPECT_EQ(ChunkWriter(header).chunk(params, 0, choice, 0, 2, true, false),
            dump(completion_chunk(header, params, 0, choice, 0, 2, true, false)));
}

/// A chat format of the byte tokenizer: "<role>: content" lines, then "A:" for the reply.
ChatSupport byte_chat() {
  auto tokenizer = std::make_shared<tokenize::Tokenizer>(tokenize::Tokenizer::bytes());
  tokenizer->set_chat_template(
      "{% for m in messages %}{{ m.role[0] }}:{{ m.content }}{{ suffix }}\n{% endfor %}"
      "{% if add_generation_prompt %}A:{% endif %}");
  return chat_support(tokenizer);
}

CompletionParams parse_chat(const std::string& body) {
  return parse_chat_request(body, "m", config(), byte_chat(), ApiLimits{}, 99);
}

TEST(ChatApi, TheMessagesAreRenderedByTheTemplate) {
  const CompletionParams p = parse_chat(R"({"messages":[{"role":"user","content":"hi"}]})");
  EXPECT_TRUE(p.chat);
  const std::string rendered = "u:hi\nA:";
  EXPECT_EQ(p.prompts,
            (std::vector<std::vector<std::int64_t>>{{rendered.begin(), rendered.end()}}));
  EXPECT_EQ(p.max_tokens, 32 - 7);  // the rest of the context
  EXPECT_FALSE(p.logprobs.has_value());
  // Text parts are joined by newlines; kwargs are the template's variables.
  const CompletionParams q = parse_chat(
      R"({"messages":[{"role":"system","content":[{"type":"text","text":"a"},
          {"type":"text","text":"b"}]}],"add_generation_prompt":false,
          "chat_template_kwargs":{"suffix":"!"},"max_completion_tokens":3,"logprobs":true,
          "top_logprobs":2,"tool_choice":"none","response_format":{"type":"text"}})");
  const std::string joined = "s:a\nb!\n";
  EXPECT_EQ(q.prompts[0], std::vector<std::int64_t>(joined.begin(), joined.end()));
  EXPECT_EQ(q.max_tokens, 3);
  EXPECT_EQ(q.logprobs, 2);
}

TEST(ChatApi, BadRequestsNameTheFieldAndTheValue) {
  const std::vector<std::tuple<std::string, std::string, std::string>> cases{
      {R"({})", "messages", "required"},
      {R"({"messages":[]})", "messages", "non-empty"},
      {R"({"messages":[{"role":"user"}]})", "messages", "messages[0] has no content"},
      {R"({"messages":[{"role":"bot","content":"x"}]})", "messages", "\"bot\""},
      {R"({"messages":[{"role":"user","content":7}]})", "messages", "content must be"},
      {R"({"messages":[{"role":"user","content":"x"}],"top_logprobs":2})", "top_logprobs",
       "needs 'logprobs'"},
      {R"({"messages":[{"role":"user","content":"x"}],"logprobs":2})", "logprobs", "true or false"},
      {R"({"messages":[{"role":"user","content":"x"}],"max_tokens":40})", "max_tokens",
       "context of 32"},
      {R"({"messages":[{"role":"user","content":")" + std::string(40, 'x') + R"("}]})", "messages",
       "context is 32"},
      {R"({"messages":[{"role":"user","content":"x"}],"chat_template_kwargs":{"messages":1}})",
       "chat_template_kwargs", "may not set 'messages'"},
      {R"({"messages":[{"role":"user","content":"x"}],"tool_choice":"auto"})", "tool_choice",
       "only \"none\""},
      {R"({"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_object"}})",
       "response_format", "not supported"},
      {R"({"messages":[{"role":"user","content":"x"}],"echo":true})", "echo", "Unrecognized"},
  };
  for (const auto& [body, param, word] : cases) {
    try {
      parse_chat(body);
      ADD_FAILURE() << "accepted " << body;
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, 400) << body;
      EXPECT_EQ(e.param, param) << body << ": " << e.message;
      EXPECT_NE(e.message.find(word), std::string::npos) << body << ": " << e.message;
    }
  }
}

TEST(ChatApi, AModelWithoutAUsableTemplateIsNamed) {
  auto plain = std::make_shared<const tokenize::Tokenizer>(tokenize::Tokenizer::bytes());
  const ChatSupport none = chat_support(plain);
  EXPECT_EQ(none.format, nullptr);
  auto macro = std::make_shared<tokenize::Tokenizer>(tokenize::Tokenizer::bytes());
  macro->set_chat_template("{% macro m() %}{% endmacro %}");
  const ChatSupport refused = chat_support(macro);
  EXPECT_NE(refused.missing.find("macro"), std::string::npos) << refused.missing;
  try {
    parse_chat_request(R"({"messages":[{"role":"user","content":"x"}]})", "m", config(), none,
                       ApiLimits{}, 1);
    ADD_FAILURE() << "a model without a template chatted";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.code, "chat_template_missing");
    EXPECT_NE(e.message.find("--chat-template"), std::string::npos) << e.message;
  }
}

TEST(ChatApi, ResponsesHaveOpenAIsChatShape) {
  const CompletionParams params = parse_chat(
      R"({"messages":[{"role":"user","content":"x"}],"logprobs":true,"top_logprobs":1})");
  ChoiceResult choice;
  choice.prompt = params.prompts[0];
  choice.tokens = {{'o', -0.25, {{'o', -0.25}}}, {'k', -0.5, {{'x', -0.125}}}};
  choice.finish_reason = "stop";
  const ResponseHeader header{"chatcmpl-1", 5, "m", 3, 99};
  const Json r = Json::parse(dump(completion_response(header, params, {choice})));
  EXPECT_EQ(r["object"], "chat.completion");
  const Json& c = r["choices"][0];
  EXPECT_EQ(c["message"], Json({{"role", "assistant"}, {"content", "ok"}}));
  EXPECT_EQ(c["finish_reason"], "stop");
  EXPECT_EQ(c["logprobs"]["content"][1]["token"], "k");
  EXPECT_EQ(c["logprobs"]["content"][1]["bytes"], Json::array({'k'}));
  EXPECT_EQ(c["logprobs"]["content"][1]["top_logprobs"][0]["token"], "x");
  EXPECT_EQ(r["usage"]["prompt_tokens"], 6);  // "u:x\nA:"
  CompletionParams streamed = params;
  streamed.stream = true;
  const Json first = completion_chunk(header, streamed, 0, choice, 0, 1, true, false);
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"], Json({{"role", "assistant"}, {"content", "o"}}));
  const Json last = completion_chunk(header, streamed, 0, choice, 2, 2, false, true);
  EXPECT_EQ(last["choices"][0]["delta"], Json::object());
  EXPECT_EQ(last["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(ChunkWriter(header, true).chunk(streamed, 0, choice, 0, 1, true, false), dump(first));
}

}  // namespace
}  // namespace meshtensor::serve
