#include <algorithm>
#include <set>

#include <gtest/gtest.h>

#include <meshtensor/comm/threads_backend.hpp>
#include <meshtensor/core/error.hpp>
#include <meshtensor/core/random.hpp>
#include <meshtensor/generate/continuous_batch.hpp>
#include <meshtensor/generate/generator.hpp>
#include <meshtensor/nn/layers.hpp>
#include <meshtensor/nn/loss.hpp>
#include <meshtensor/tp/style.hpp>

#include "support/tiny_gpt.hpp"

namespace meshtensor::generate {
namespace {

nn::GptConfig config() {
  return testing::tiny_gpt({.context = 24, .vocabulary = 29, .seed = 3, .init_std = 0.3});
}

std::vector<std::int64_t> prompt(std::int64_t length, std::uint64_t seed) {
  std::vector<std::int64_t> ids;
  for (std::int64_t i = 0; i < length; ++i)
    ids.push_back(uniform_int_sample(seed, static_cast<std::uint64_t>(i), 0, 28));
  return ids;
}

Request request(std::int64_t length, std::uint64_t seed, std::int64_t new_tokens,
                double temperature = 0.9, std::int64_t top_k = 7) {
  return {prompt(length, seed), new_tokens, {temperature, top_k, seed * 31 + 1}};
}

/// The log-probabilities the trainer's forward gives `completion`'s tokens after `prompt`: the
/// whole sequence through Gpt::forward, then the loss of each row.
std::vector<double> trainer_logprobs(nn::Gpt& model, const std::vector<std::int64_t>& prompt,
                                     const Completion& completion, bool exact) {
  std::vector<std::int64_t> sequence = prompt;
  sequence.insert(sequence.end(), completion.tokens.begin(), completion.tokens.end() - 1);
  const auto length = static_cast<std::int64_t>(sequence.size());
  Tensor tokens(Shape{1, length}, DType::i64);
  std::copy(sequence.begin(), sequence.end(), tokens.values<std::int64_t>().begin());
  const Tensor logits = model.forward(tokens).reshape(Shape{length, 29});
  std::vector<std::int32_t> labels(static_cast<std::size_t>(length), 0);
  for (std::size_t i = 0; i < completion.tokens.size(); ++i)
    labels[prompt.size() - 1 + i] = static_cast<std::int32_t>(completion.tokens[i]);
  nn::CrossEntropyOptions options;
  options.exact_sums = exact;
  const auto losses = nn::softmax_cross_entropy(logits, labels, options).losses;
  std::vector<double> out;
  for (std::size_t i = 0; i < completion.tokens.size(); ++i)
    out.push_back(-losses.values<double>()[prompt.size() - 1 + i]);
  return out;
}

void expect_same_bits(const Completion& a, const Completion& b, const std::string& what) {
  EXPECT_EQ(a.tokens, b.tokens) << what;
  ASSERT_EQ(a.logprobs.size(), b.logprobs.size()) << what;
  for (std::size_t i = 0; i < a.logprobs.size(); ++i)
    EXPECT_EQ(std::bit_cast<std::uint64_t>(a.logprobs[i]),
              std::bit_cast<std::uint64_t>(b.logprobs[i]))
        << what << " token " << i;
}

TEST(Generator, LogprobsAreTheTrainersForwardBitForBit) {
  for (const bool exact : {false, true}) {
    nn::Gpt model(config());
    model.set_exact_sums(exact);
    Generator generator(model, {4, 3, exact});
    const std::vector<Request> requests{request(5, 1, 9), request(1, 2, 12, 0.0, 0),
                                        request(11, 3, 6), request(7, 4, 10, 1.5, 0)};
    const auto completions = generator.generate(requests);
    for (std::size_t r = 0; r < requests.size(); ++r) {
      ASSERT_EQ(static_cast<std::int64_t>(completions[r].tokens.size()),
                requests[r].max_new_tokens);
      const auto want = trainer_logprobs(model, requests[r].prompt, completions[r], exact);
      for (std::size_t i = 0; i < want.size(); ++i) {
        EXPECT_EQ(std::bit_cast<std::uint64_t>(completions[r].logprobs[i]),
                  std::bit_cast<std::uint64_t>(want[i]))
            << "exact " << exact << " request " << r << " token " << i;
        EXPECT_LE(completions[r].logprobs[i], 0.0);
      }
    }
  }
}

/// On a tensor-parallel layout the trainer's forward is the split model and its
/// vocabulary-parallel loss; in ordered mode the generator on the same layout gives its bits.
TEST(Generator, OnTensorParallelRanksLogprobsAreThatLayoutsTrainerBits) {
  const std::vector<Request> requests{request(5, 1, 7), request(3, 2, 9, 0.0, 0)};
  comm::run_threads(2, [&](std::shared_ptr<comm::Communicator> world) {
    nn::Gpt model(config());
    tp::TensorParallel group(world, comm::ReductionMode::ordered, false);
    tp::parallelize_module(model, group, tp::decoder_plan(model.spec(), false));
    Generator generator(model, {2, 4, false}, &group);
    const auto completions = generator.generate(requests);
    for (std::size_t r = 0; r < requests.size(); ++r) {
      std::vector<std::int64_t> sequence = requests[r].prompt;
      sequence.insert(sequence.end(), completions[r].tokens.begin(),
                      completions[r].tokens.end() - 1);
      const auto length = static_cast<std::int64_t>(sequence.size());
      Tensor tokens(Shape{1, length}, DType::i64);
      std::copy(sequence.begin(), sequence.end(), tokens.values<std::int64_t>().begin());
      const Tensor local = model.forward(tokens);
      std::vector<std::int32_t> labels(static_cast<std::size_t>(length), 0);
      const std::size_t first = requests[r].prompt.size() - 1;
      for (std::size_t i = 0; i < completions[r].tokens.size(); ++i)
        labels[first + i] = static_cast<std::int32_t>(completions[r].tokens[i]);
      const auto losses = tp::parallel_cross_entropy(local.reshape(Shape{length, local.shape()[2]}),
                                                     labels, &group, 29, false)
                              .losses;
      for (std::size_t i = 0; i < completions[r].tokens.size(); ++i) {
        EXPECT_EQ(std::bit_cast<std::uint64_t>(completions[r].logprobs[i]),
                  std::bit_cast<std::uint64_t>(-losses.values<double>()[first + i]))
            << "request " << r << " token " << i;
      }
    }
  });
}

TEST(Generator, ARequestsTokensDoNotDependOnTheBatchOrTheChunkSize) {
  nn::Gpt model(config());
  const Request mine = request(6, 42, 10);
  Generator alone_generator(model, {1, 64, false});
  const Completion alone = alone_generator.generate({mine}).front();
  for (const std::int64_t batch : {2, 5, 32}) {
    for (const std::int64_t chunk : {1, 4, 64}) {
      std::vector<Request> requests;
      for (std::int64_t i = 0; i < batch - 1; ++i)
        requests.push_back(
            request(1 + (i * 5) % 13, 100 + static_cast<std::uint64_t>(i), 1 + (i * 3) % 9));
      const auto at = static_cast<std::size_t>((batch * 7 / 3) % batch);  // 0, 1, 10
      requests.insert(requests.begin() + static_cast<std::ptrdiff_t>(at), mine);
      Generator generator(model, {batch / 2 + 1, chunk, false});
      const auto completions = generator.generate(requests);
      expect_same_bits(completions[at], alone,
                       "batch " + std::to_string(batch) + " chunk " + std::to_string(chunk));
    }
  }
}

/// Negative control: with a reduction split that depends on the batch (nn::BatchVariantScope),
/// the same comparisons fail, so they can catch a batch-variant kernel.
TEST(Generator, ABatchDependentKernelBreaksTheComparisons) {
  nn::Gpt model(config());
  const Request mine = request(6, 42, 10, 0.0, 0);
  std::vector<Request> crowd{request(9, 5, 4), mine, request(2, 6, 8)};
  const nn::BatchVariantScope variant;
  Generator alone_generator(model, {1, 1, false});
  const Completion alone = alone_generator.generate({mine}).front();  // one row per call
  Generator batched_generator(model, {3, 4, false});
  const Completion batched = batched_generator.generate(crowd)[1];
  EXPECT_NE(alone.logprobs, batched.logprobs);
  EXPECT_NE(trainer_logprobs(model, mine.prompt, batched, false), batched.logprobs);
}

TEST(Generator, GreedyPicksTheFirstLargestLogitAndSamplingDependsOnSeedAndPosition) {
  const std::vector<float> logits{0.5f, 2.0f, -1.0f, 2.0f, 1.9f};
  EXPECT_EQ(sample_token(logits, {0.0, 0, 9}, 3), 1);
  // top_k 1 is greedy whatever the temperature.
  EXPECT_EQ(sample_token(logits, {5.0, 1, 9}, 3), 1);
  // A draw depends on (seed, position) only, and stays inside the top k.
  for (std::int64_t position = 0; position < 50; ++position) {
    const std::int64_t t = sample_token(logits, {1.0, 3, 7}, position);
    EXPECT_EQ(t, sample_token(logits, {1.0, 3, 7}, position));
    EXPECT_TRUE(t == 1 || t == 3 || t == 4) << t;
  }
}

TEST(Generator, BadRequestsNameTheValue) {
  nn::Gpt model(config());
  Generator generator(model, {});
  const auto fails = [&](const Request& r, const std::string& text) {
    try {
      generator.generate({request(3, 1, 2), r});
      ADD_FAILURE() << "no error for " << text;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("request 1"), std::string::npos) << e.what();
    }
  };
  fails({{}, 3, {}}, "prompt is empty");
  fails({{1, 29}, 3, {}}, "token 29 at prompt position 1");
  fails({prompt(20, 1), 5, {}},
        "20 tokens plus 5 new tokens is longer than the model's context of 24");
  fails({{1}, 0, {}}, "max_new_tokens 0");
  fails({{1}, 1, {-1.0, 0, 0}}, "temperature -1");
  fails({{1}, 1, {1.0, 0, 0, 1.5}}, "top_p 1.5");
  Request too_many{{1}, 1, {}};
  too_many.top_logprobs = 30;
  fails(too_many, "top_logprobs 30");
  Request bad_stop{{1}, 1, {}};
  bad_stop.stop_tokens = {3, 29};
  fails(bad_stop, "stop token 29");
  EXPECT_THROW(Generator(model, {0, 1, false}), InvalidArgument);
}

// A request ends at the first stop token it draws, which it keeps; what it drew before has the
// bits it has without stop tokens, and the others in the batch are unaffected.
TEST(Generator, ARequestEndsAtItsFirstStopToken) {
  nn::Gpt model(config());
  Generator generator(model, {4, 4, false});
  const Request free_running = request(5, 9, 12);
  const Completion whole = generator.generate({free_running}).front();
  ASSERT_EQ(whole.tokens.size(), 12u);
  Request stopping = free_running;
  stopping.stop_tokens = {whole.tokens[4]};
  const auto first = static_cast<std::size_t>(
      std::find(whole.tokens.begin(), whole.tokens.end(), whole.tokens[4]) - whole.tokens.begin());
  const std::vector<Completion> both = generator.generate({stopping, free_running});
  Completion prefix;
  prefix.tokens.assign(whole.tokens.begin(), whole.tokens.begin() + first + 1);
  prefix.logprobs.assign(whole.logprobs.begin(), whole.logprobs.begin() + first + 1);
  expect_same_bits(both[0], prefix, "stopped");
  expect_same_bits(both[1], whole, "the other request");
  EXPECT_EQ(text_tokens(both[0], stopping).size(), first);
  EXPECT_EQ(text_tokens(both[1], stopping).size(), 12u - (whole.tokens[11] == whole.tokens[4]));
}

/// Requests added and removed between steps (a server's traffic) get the bits they get alone.
TEST(ContinuousBatch, RequestsJoiningAndLeavingMidRunGetTheirBitsAlone) {
  nn::Gpt model(config());
  const Request mine = request(6, 42, 10);
  Generator alone_generator(model, {1, 64, false});
  const Completion alone = alone_generator.generate({mine}).front();
  ContinuousBatch batch(model, {4, 3, false}, nullptr, 4);
  batch.add(100, request(9, 5, 12));
  batch.add(101, request(2, 6, 12));
  batch.step();
  batch.step();
  batch.add(7, mine);
  batch.add(102, request(4, 8, 12));
  Completion got;
  for (int step = 0; batch.size() > 0; ++step) {
    if (step == 3) {
      EXPECT_TRUE(batch.remove(101));  // a client that left
    }
    if (step == 4) batch.add(103, request(11, 9, 5));
    for (const StepEvent& event : batch.step()) {
      if (event.id != 7 || !event.drawn) continue;
      got.tokens.push_back(event.drawn->token);
      got.logprobs.push_back(event.drawn->logprob);
      if (event.finished) {
        EXPECT_EQ(got.tokens.size(), 10u);
      }
    }
  }
  expect_same_bits(got, alone, "joining mid-run");
  EXPECT_FALSE(batch.remove(7));  // left when done
  EXPECT_EQ(batch.free_slots(), 4);
}

/// Prompt scores are the trainer's loss of each prompt token; top log-probabilities are the
/// most likely tokens scored the same way (the drawn token among them has the same bits).
TEST(ContinuousBatch, PromptScoresAndTopLogprobsAreTheTrainersBits) {
  for (const bool exact : {false, true}) {
    nn::Gpt model(config());
    model.set_exact_sums(exact);
    Request r = request(7, 3, 4, 0.0, 0);
    r.score_prompt = true;
    r.top_logprobs = 5;
    ContinuousBatch batch(model, {2, 3, exact}, nullptr, 2);
    batch.add(1, r);
    std::vector<ScoredToken> prompt_scores;
    std::vector<ScoredToken> drawn;
    while (batch.size() > 0) {
      for (const StepEvent& event : batch.step()) {
        prompt_scores.insert(prompt_scores.end(), event.prompt.begin(), event.prompt.end());
        if (event.drawn) drawn.push_back(*event.drawn);
      }
    }
    ASSERT_EQ(prompt_scores.size(), 6u);
    // The prompt's own tokens as a "completion" of its first token.
    Completion as_completion;
    for (std::size_t i = 1; i < r.prompt.size(); ++i)
      as_completion.tokens.push_back(r.prompt[i]);
    const auto want = trainer_logprobs(model, {r.prompt[0]}, as_completion, exact);
    for (std::size_t i = 0; i < prompt_scores.size(); ++i) {
      EXPECT_EQ(prompt_scores[i].token, r.prompt[i + 1]);
      EXPECT_EQ(std::bit_cast<std::uint64_t>(prompt_scores[i].logprob),
                std::bit_cast<std::uint64_t>(want[i]))
          << "exact " << exact << " prompt token " << i + 1;
    }
    for (const ScoredToken& t : drawn) {
      ASSERT_EQ(t.top.size(), 5u);
      // Greedy: the drawn token is the most likely one, with the same bits.
      EXPECT_EQ(t.top[0].first, t.token);
      EXPECT_EQ(std::bit_cast<std::uint64_t>(t.top[0].second),
                std::bit_cast<std::uint64_t>(t.logprob));
      for (std::size_t k = 1; k < t.top.size(); ++k)
        EXPECT_LE(t.top[k].second, t.top[k - 1].second);
    }
  }
}

TEST(Generator, TopPKeepsTheFewestMostLikelyTokensCoveringIt) {
  // Probabilities at temperature 1: about 0.64, 0.24, 0.09, 0.03.
  const std::vector<float> logits{0.0f, 3.0f, 1.0f, 2.0f};
  std::set<std::int64_t> seen;
  for (std::int64_t position = 0; position < 400; ++position)
    seen.insert(sample_token(logits, {1.0, 0, 11, 0.8}, position));
  EXPECT_EQ(seen, (std::set<std::int64_t>{1, 3}));  // 0.64 < 0.8 <= 0.88
  for (std::int64_t position = 0; position < 50; ++position)
    EXPECT_EQ(sample_token(logits, {1.0, 0, 11, 0.0}, position), 1);  // top_p 0: the likeliest
  // top_p 1 is the plain draw.
  for (std::int64_t position = 0; position < 50; ++position)
    EXPECT_EQ(sample_token(logits, {1.0, 0, 11, 1.0}, position),
              sample_token(logits, {1.0, 0, 11}, position));
}

}  // namespace
}  // namespace meshtensor::generate
