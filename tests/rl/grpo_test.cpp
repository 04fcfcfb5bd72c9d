#include <cmath>
#include <fstream>
#include <mutex>
#include <tuple>

#include <gtest/gtest.h>

#include <meshtensor/comm/threads_backend.hpp>
#include <meshtensor/core/error.hpp>
#include <meshtensor/rl/grpo.hpp>

#include "support/tiny_gpt.hpp"

namespace meshtensor::rl {
namespace {

nn::GptConfig tiny_gpt() {
  return testing::tiny_gpt({.heads = 4, .context = 16, .seed = 9, .init_std = 0.3});
}

RlConfig tiny_run(train::TrainConfig trainer, GeneratorLayout generator,
                  std::int64_t trainer_ranks = 0) {
  RlConfig config;
  config.trainer_ranks = trainer_ranks;
  config.train = std::move(trainer);
  config.train.mode = comm::ReductionMode::exact;
  config.train.seed = 4;
  config.train.schedule.base = 3e-3;
  config.generator = generator;
  config.model = tiny_gpt();
  config.steps = 2;
  config.prompts = 3;
  config.samples = 3;
  config.new_tokens = 5;
  return config;
}

/// run_rl on rl_world_ranks() thread ranks; every rank must end on rank 0's digest.
RlResult rl_on_threads(const RlTask& task, const RlConfig& config) {
  std::mutex mutex;
  const std::int64_t ranks = rl_world_ranks(config);
  std::vector<RlResult> results(static_cast<std::size_t>(ranks));
  comm::run_threads(static_cast<int>(ranks), [&](comm::Communicator& world) {
    RlResult result = run_rl(world, task, config);
    const std::lock_guard lock(mutex);
    results[static_cast<std::size_t>(world.rank())] = std::move(result);
  });
  for (const RlResult& r : results)
    EXPECT_EQ(r.weights_digest, results.front().weights_digest);
  return results.front();
}

train::TrainConfig named(const std::string& shape, const std::string& names, bool sp = false) {
  train::TrainConfig config;
  config.mesh = train::parse_named_mesh(shape, names);
  config.sequence_parallel = sp;
  return config;
}

TEST(Grpo, ExactRunIsTheSameBitsOnEveryPairOfLayouts) {
  const RlTask task = arithmetic_task();
  train::TrainConfig fsdp;
  fsdp.strategy = train::Strategy::fsdp;
  train::TrainConfig one;
  const RlResult reference = rl_on_threads(task, tiny_run(one, {1, 1}));
  ASSERT_EQ(reference.steps.size(), 2U);
  EXPECT_EQ(reference.tokens, 2 * 3 * 3 * 5);
  EXPECT_EQ(reference.identical, reference.tokens);
  const std::vector<std::pair<train::TrainConfig, GeneratorLayout>> pairs{
      {fsdp, {2, 1}},
      {fsdp, {1, 2}},
      {named("2x2", "fsdp,tp", true), {4, 1}},
      {named("2x2", "fsdp,tp", true), {2, 2}},
      {named("2x2", "dp,tp"), {1, 4}},
      {fsdp, {4, 1}},
  };
  for (const auto& [trainer, generator] : pairs) {
    const RlResult result = rl_on_threads(task, tiny_run(trainer, generator));
    SCOPED_TRACE(result.trainer_layout + " / " + result.generator_layout);
    EXPECT_EQ(result.weights_digest, reference.weights_digest);
    EXPECT_EQ(result.identical, result.tokens);
  }
  // Layouts on different rank counts: the smaller side takes the first ranks.
  const std::vector<std::tuple<train::TrainConfig, std::int64_t, GeneratorLayout>> uneven{
      {one, 1, {1, 2}},
      {fsdp, 4, {1, 1}},
      {fsdp, 4, {1, 2}},
      {named("2x2", "fsdp,tp", true), 0, {1, 1}},
      {named("2x2", "fsdp,tp", true), 0, {1, 2}},
      {fsdp, 2, {2, 2}},
  };
  for (const auto& [trainer, ranks, generator] : uneven) {
    const RlResult result = rl_on_threads(task, tiny_run(trainer, generator, ranks));
    SCOPED_TRACE(result.trainer_layout + " / " + result.generator_layout);
    EXPECT_EQ(result.weights_digest, reference.weights_digest);
    EXPECT_EQ(result.identical, result.tokens);
    EXPECT_EQ(result.tokens, reference.tokens);
    for (std::size_t s = 0; s < result.steps.size(); ++s) {
      EXPECT_EQ(result.steps[s].reward_mean, reference.steps[s].reward_mean);
      EXPECT_EQ(result.steps[s].loss, reference.steps[s].loss);
    }
  }
}

TEST(Grpo, SeveralEpochsAndMiniBatchesKeepParity) {
  const RlTask task = arithmetic_task();
  RlConfig config = tiny_run({}, {1, 1});
  config.ppo_epochs = 2;
  config.minibatches = 3;
  config.kl = 0.1;
  const RlResult one = rl_on_threads(task, config);
  EXPECT_EQ(one.identical, one.tokens);
  EXPECT_GT(one.steps.back().kl_mean, 0.0);
  train::TrainConfig fsdp;
  fsdp.strategy = train::Strategy::fsdp;
  fsdp.micro_batches = 2;
  RlConfig spread = config;
  spread.train = fsdp;
  spread.train.mode = comm::ReductionMode::exact;
  spread.train.seed = 4;
  spread.train.schedule.base = 3e-3;
  spread.generator = {1, 2};
  EXPECT_EQ(rl_on_threads(task, spread).weights_digest, one.weights_digest);
}

TEST(Grpo, TheUpdateChangesTheWeightsAndRewardsArePerSequence) {
  const RlTask task = arithmetic_task();
  RlConfig config = tiny_run({}, {1, 1});
  config.steps = 1;
  const RlResult after_one = rl_on_threads(task, config);
  config.steps = 2;
  const RlResult after_two = rl_on_threads(task, config);
  EXPECT_NE(after_one.weights_digest, after_two.weights_digest);
  EXPECT_EQ(after_two.steps.front().reward_mean, after_one.steps.front().reward_mean);
}

TEST(Grpo, InExactModeATokenOffTheTrainersBitsStopsTheRunNamingIt) {
  const RlTask task = arithmetic_task();
  RlConfig config = tiny_run({}, {1, 1});
  config.generator_mode = comm::ReductionMode::ordered;
  try {
    rl_on_threads(task, config);
    ADD_FAILURE() << "an ordered generator passed the exact parity check";
  } catch (const DataError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("exact mode: at step 1, prompt 0 sample 0 position 0"), std::string::npos)
        << what;
  }
  // In ordered mode the same difference is reported, and the run goes on.
  config.train.mode = comm::ReductionMode::ordered;
  config.generator_mode = comm::ReductionMode::exact;
  const RlResult reported = rl_on_threads(task, config);
  EXPECT_EQ(reported.tokens, 2 * 3 * 3 * 5);
  EXPECT_LT(reported.identical, reported.tokens);
  EXPECT_GT(reported.max_abs_diff, 0.0);
}

TEST(Grpo, BadConfigurationsNameTheValue) {
  const RlTask task = arithmetic_task();
  const auto refused = [&](const RlConfig& config, const std::string& words) {
    try {
      validate_rl_config(config, task, config.generator.ranks());
      ADD_FAILURE() << "accepted: " << words;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  RlConfig c = tiny_run({}, {1, 1});
  c.samples = 1;
  refused(c, "at least 2 samples per prompt, got 1");
  c = tiny_run({}, {1, 1});
  c.kl = -0.5;
  refused(c, "-0.5");
  c = tiny_run({}, {1, 1});
  c.prompts = 0;
  refused(c, "prompts per step must be at least 1, got 0");
  c = tiny_run({}, {1, 1});
  c.new_tokens = 11;
  refused(c, "context of 16");
  c = tiny_run({}, {1, 3});
  refused(c, "tensor-parallel degree 3 does not divide the model's 4 heads");
  c = tiny_run({}, {1, 1});
  c.temperature = 0;
  refused(c, "temperature");
  c = tiny_run({}, {1, 1});
  c.clip_ratio = 1.5;
  refused(c, "1.5");
}

TEST(Grpo, ARewardThatFailsStopsTheRunNamingThePromptAndSample) {
  RlTask task = arithmetic_task();
  const auto fails_with = [&](RewardFunction reward, const std::string& words) {
    task.reward = std::move(reward);
    try {
      rl_on_threads(task, tiny_run({}, {2, 1}));
      ADD_FAILURE() << "no error for " << words;
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(words), std::string::npos) << what;
      EXPECT_NE(what.find("prompt"), std::string::npos) << what;
      EXPECT_NE(what.find("sample"), std::string::npos) << what;
    }
  };
  fails_with([](const std::string&, const std::string&) { return std::nan(""); }, "nan");
  fails_with([](const std::string&,
                const std::string&) -> double { throw std::runtime_error("scorer offline"); },
             "scorer offline");
  fails_with([](const std::string&, const std::string&) { return INFINITY; }, "inf");
}

TEST(Rewards, EnglishWordFraction) {
  EXPECT_EQ(split_words("Don't stop--the 2 dogs' bone."),
            (std::vector<std::string_view>{"Don't", "stop", "the", "dogs", "bone"}));
  const std::string path = ::testing::TempDir() + "/words";
  {
    std::ofstream out(path);
    out << "the\ncat\nsat\ndon't\nA\nb\nEnglish\n";
  }
  const auto dictionary = Dictionary::load(path);
  // Case does not matter; "b" is no word although listed; repeats count once.
  EXPECT_DOUBLE_EQ(english_word_fraction(*dictionary, "The cat sat"), 1.0);
  EXPECT_DOUBLE_EQ(english_word_fraction(*dictionary, "the cat b zq"), 0.5);
  EXPECT_DOUBLE_EQ(english_word_fraction(*dictionary, "cat cat cat cat"), 0.25);
  EXPECT_DOUBLE_EQ(english_word_fraction(*dictionary, "Don't, english!"), 2.0 / 3);
  EXPECT_DOUBLE_EQ(english_word_fraction(*dictionary, "Don't, English cat"), 1.0);
  EXPECT_DOUBLE_EQ(english_word_fraction(*dictionary, "?!?! 42"), 0.0);
  // At least one word counted per 6 bytes: one English word among blanks scores 1/4.
  EXPECT_DOUBLE_EQ(english_word_fraction(*dictionary, "       cat          "), 0.25);
  EXPECT_THROW(Dictionary::load(::testing::TempDir() + "/no-such-list"), DataError);
  const RlTask arithmetic = arithmetic_task();
  EXPECT_EQ(arithmetic.prompts.size(), 1600U);
  EXPECT_EQ(arithmetic.reward("12+30=", "42\nxx"), 1.0);
  EXPECT_EQ(arithmetic.reward("12+30=", "420"), 0.75);
  EXPECT_EQ(arithmetic.reward("12+30=", "41."), 0.5);
  EXPECT_EQ(arithmetic.reward("12+30=", "7"), 0.25);
  EXPECT_EQ(arithmetic.reward("12+30=", " 42"), 0.0);
}

}  // namespace
}  // namespace meshtensor::rl
