#include <bit>

#include <gtest/gtest.h>

#include <meshtensor/serve/scheduler.hpp>

namespace meshtensor::serve {
namespace {

using namespace std::chrono_literals;

std::shared_ptr<Job> job(std::int64_t prompts, std::int64_t n, std::vector<std::string> stop = {}) {
  auto j = std::make_shared<Job>();
  for (std::int64_t p = 0; p < prompts; ++p)
    j->params.prompts.push_back({1 + p, 2});
  j->params.n = n;
  j->params.max_tokens = 4;
  j->params.sampling.seed = 100;
  j->params.sampling.temperature = 0.7;
  j->params.stop = std::move(stop);
  return j;
}

generate::StepEvent drawn(std::uint64_t id, std::int64_t token, bool finished = false) {
  generate::StepEvent e;
  e.id = id;
  e.drawn = generate::ScoredToken{token, -1.0, {}};
  e.finished = finished;
  return e;
}

TEST(Scheduler, AdmitsChoicesInOrderAsSlotsFreeWithTheirSeeds) {
  Metrics metrics;
  Scheduler scheduler({2, 16}, metrics);
  const auto a = job(2, 2);  // 4 choices
  scheduler.submit(a);
  StepPlan plan = scheduler.next_plan(0, 2, 10ms);
  ASSERT_EQ(plan.add.size(), 2u);
  EXPECT_EQ(plan.add[0].request.sampling.seed, 100u);
  EXPECT_EQ(plan.add[1].request.sampling.seed, 101u);  // choice 1 of prompt 0
  EXPECT_EQ(plan.add[0].request.prompt, (std::vector<std::int64_t>{1, 2}));
  // Round trip between ranks keeps every bit.
  const StepPlan copy = decode_plan(encode_plan(plan));
  EXPECT_EQ(std::bit_cast<std::uint64_t>(copy.add[1].request.sampling.temperature),
            std::bit_cast<std::uint64_t>(0.7));
  EXPECT_EQ(copy.add[1].id, plan.add[1].id);
  // Choice 0 finishes: its slot goes to the next choice (prompt 1, seed 100).
  scheduler.deliver({drawn(plan.add[0].id, 5, true)});
  plan = scheduler.next_plan(1, 1, 10ms);
  ASSERT_EQ(plan.add.size(), 1u);
  EXPECT_EQ(plan.add[0].request.prompt, (std::vector<std::int64_t>{2, 2}));
  EXPECT_EQ(plan.add[0].request.sampling.seed, 100u);
  const std::lock_guard lock(a->mutex);
  EXPECT_EQ(a->choices[0].finish_reason, "length");
  EXPECT_EQ(a->unfinished, 3u);
}

TEST(Scheduler, AFullQueueAnswers429AndADrainingOne503) {
  Metrics metrics;
  Scheduler scheduler({1, 3}, metrics);
  scheduler.submit(job(1, 3));
  try {
    scheduler.submit(job(1, 1));
    ADD_FAILURE() << "a fourth choice was queued";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 429);
  }
  scheduler.drain();
  try {
    scheduler.submit(job(1, 1));
    ADD_FAILURE() << "queued while draining";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 503);
  }
  // Draining finishes what was accepted, then says exit.
  for (int i = 0; i < 3; ++i) {
    const StepPlan plan = scheduler.next_plan(0, 1, 10ms);
    ASSERT_EQ(plan.add.size(), 1u);
    EXPECT_FALSE(plan.exit);
    scheduler.deliver({drawn(plan.add[0].id, 1, true)});
  }
  EXPECT_TRUE(scheduler.next_plan(0, 1, 10ms).exit);
}

TEST(Scheduler, ACancelledJobLeavesTheQueueAndTheBatch) {
  Metrics metrics;
  Scheduler scheduler({2, 16}, metrics);
  const auto gone = job(1, 3);
  scheduler.submit(gone);
  const StepPlan plan = scheduler.next_plan(0, 2, 10ms);
  ASSERT_EQ(plan.add.size(), 2u);
  scheduler.cancel(gone);
  const StepPlan next = scheduler.next_plan(2, 0, 10ms);
  EXPECT_EQ(next.remove, (std::vector<std::uint64_t>{plan.add[0].id, plan.add[1].id}));
  EXPECT_TRUE(next.add.empty());                  // its third choice left the queue
  scheduler.deliver({drawn(plan.add[0].id, 1)});  // a step that raced the cancel: ignored
  const std::lock_guard lock(gone->mutex);
  EXPECT_TRUE(gone->cancelled);
  EXPECT_TRUE(gone->choices[0].tokens.empty());
}

TEST(Scheduler, AStopSequenceEndsTheChoiceAndFreesItsSlot) {
  Metrics metrics;
  Scheduler scheduler({1, 16}, metrics);
  const auto j = job(1, 1, {"bc"});
  scheduler.submit(j);
  const StepPlan plan = scheduler.next_plan(0, 1, 10ms);
  const std::uint64_t id = plan.add.at(0).id;
  scheduler.deliver({drawn(id, 'a')});
  scheduler.deliver({drawn(id, 'b')});
  scheduler.deliver({drawn(id, 'c')});
  EXPECT_EQ(scheduler.next_plan(1, 0, 10ms).remove, std::vector<std::uint64_t>{id});
  const std::lock_guard lock(j->mutex);
  EXPECT_EQ(j->choices[0].finish_reason, "stop");
  ASSERT_EQ(j->choices[0].tokens.size(), 1u);
  EXPECT_EQ(j->choices[0].tokens[0].token, 'a');
  EXPECT_EQ(j->unfinished, 0u);
}

TEST(Scheduler, AReloadWaitsForTheRunningChoicesAndNewJobsWaitForIt) {
  Metrics metrics;
  Scheduler scheduler({4, 16}, metrics);
  scheduler.set_weights_step(3);
  const auto old_job = job(1, 1);
  scheduler.submit(old_job);
  const StepPlan first = scheduler.next_plan(0, 4, 10ms);
  ASSERT_EQ(first.add.size(), 1u);
  const auto reload = scheduler.reload();
  const auto new_job = job(1, 1);
  scheduler.submit(new_job);
  // The running choice goes on; the new job waits for the new weights.
  const StepPlan during = scheduler.next_plan(1, 3, 10ms);
  EXPECT_TRUE(during.add.empty());
  EXPECT_FALSE(during.reload);
  scheduler.deliver({drawn(first.add[0].id, 1, true)});
  EXPECT_TRUE(scheduler.next_plan(0, 4, 10ms).reload);
  scheduler.reloaded({true, 9, "dir", ""});
  EXPECT_EQ(reload.get().step, 9);
  const StepPlan after = scheduler.next_plan(0, 4, 10ms);
  EXPECT_EQ(after.add.size(), 1u);
  EXPECT_EQ(old_job->header.weights_step, 3);
  EXPECT_EQ(new_job->header.weights_step, 9);
}

}  // namespace
}  // namespace meshtensor::serve
