#include <string>

#include <gtest/gtest.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/rl/settings.hpp>

namespace meshtensor::rl {
namespace {

std::string message(const RlSettings& settings) {
  try {
    settings.config();
  } catch (const Error& error) {
    return error.what();
  }
  return "no error";
}

TEST(RlSettings, TheTrainerTakesRlsDefaultsAndTheGivenFields) {
  RlSettings settings;
  const RlConfig defaults = settings.config();
  EXPECT_EQ(defaults.train.schedule.base, 3e-4);
  EXPECT_EQ(defaults.train.mode, comm::ReductionMode::exact);
  EXPECT_EQ(defaults.train.clip_grad_norm, 1.0);
  EXPECT_EQ(defaults.train.schedule.kind, nn::LrSchedule::Kind::constant);
  EXPECT_EQ(defaults.steps, 20);
  EXPECT_EQ(defaults.kl, 0.05);
  settings.set("lr", "0.01");
  settings.set("mesh", "2x2");
  settings.set("names", "fsdp,tp");
  settings.set("stop_after", "3");
  settings.set("prompts", "5");
  const RlConfig given = settings.config();
  EXPECT_EQ(given.train.schedule.base, 0.01);
  EXPECT_EQ(train::mesh_dim(given.train, "tp"), 2);
  EXPECT_EQ(given.train.stop_after, 3);
  EXPECT_EQ(given.prompts, 5);
  EXPECT_EQ(settings.trainer().mesh_ranks(), 4);
}

TEST(RlSettings, ErrorsNameTheFields) {
  RlSettings native;
  native.set("mode", "native");
  EXPECT_EQ(message(native),
            "`mode` native: the generator's log-probabilities would not be the trainer's; use "
            "exact (the default) or ordered");
  RlSettings both;
  both.set("init", "ckpt");
  both.set("model", "gpt");
  EXPECT_EQ(message(both), "`init` ckpt brings its own model; `model` gpt does not apply");
  RlSettings piped;
  piped.set("mesh", "2");
  piped.set("names", "pp");
  EXPECT_NE(message(piped).find("not pp"), std::string::npos);
  RlSettings prompts;
  prompts.set("prompts", "0");
  EXPECT_EQ(message(prompts), "`prompts`: '0' is too small (at least 1)");
  RlSettings task;
  task.set("task", "arithmetic");
  task.set("data", "/tmp/text");
  EXPECT_THROW(task.task(), ParseError);
  EXPECT_THROW(RlSettings().set("epochs", "2"), InvalidArgument);
}

}  // namespace
}  // namespace meshtensor::rl
