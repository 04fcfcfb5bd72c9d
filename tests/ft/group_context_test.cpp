// The cross-group data plane: Gloo contexts among a quorum's members, met through the
// coordinator's store; a lost member makes the survivors' operation fail within the timeout,
// and the next quorum's context works without it.
#include <chrono>
#include <condition_variable>
#include <future>
#include <mutex>
#include <numeric>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/ft/coordinator.hpp>
#include <meshtensor/ft/group_context.hpp>

namespace meshtensor::ft {
namespace {

const RunShape kRun{3, 2, "gpt exact"};

/// Three groups meet, sum, broadcast and gather; then group 2 is lost: its process dies (its
/// connections close) or, `silent`, stops answering while its connections stay open (SIGSTOP, a
/// cut link). The survivors' next operation fails within the timeout and the next quorum's
/// context works without it.
void lose_a_member(bool silent) {
  Coordinator coordinator({"127.0.0.1", 0, {30.0, 3.0}});
  coordinator.start();
  const std::string address = "127.0.0.1:" + std::to_string(coordinator.port());
  std::promise<void> lost_gone;
  std::shared_future<void> gone = lost_gone.get_future().share();
  std::promise<void> survivors_done;
  // Every group is past the three operations before group 2 goes: a member that dies while the
  // others are still inside an operation fails that operation for them, which is the redo's
  // case, not this test's.
  std::mutex mutex;
  std::condition_variable arrived;
  int past = 0;
  const auto past_the_operations = [&] {
    std::unique_lock lock(mutex);
    ++past;
    arrived.notify_all();
    return arrived.wait_for(lock, std::chrono::seconds(30), [&] { return past == 3; });
  };
  std::vector<std::future<std::string>> groups;
  for (std::int64_t g = 0; g < 3; ++g) {
    groups.push_back(std::async(std::launch::async, [&, g]() -> std::string {
      auto client = std::make_unique<CoordinatorClient>(address, g, kRun, 5.0);
      Quorum quorum = client->quorum(0, 10.0);
      auto context =
          std::make_unique<GroupContext>(address, g, quorum, "shard0", "127.0.0.1", 20.0);
      std::vector<std::int64_t> values{g + 1, 10 * (g + 1), std::int64_t{1} << 40};
      context->all_reduce_sum(values);
      EXPECT_EQ(values, (std::vector<std::int64_t>{6, 60, std::int64_t{3} << 40}));
      std::vector<char> word(5, static_cast<char>('a' + g));
      context->broadcast(word, 1);
      EXPECT_EQ(std::string(word.begin(), word.end()), "bbbbb");
      const std::vector<char> all =
          context->all_gather(std::vector<char>{static_cast<char>('x' + g)});
      EXPECT_EQ(std::string(all.begin(), all.end()), "xyz");
      if (!past_the_operations()) return "stuck before the loss";
      if (g == 2) {
        if (!silent) {  // the process dies: its contexts and connections close
          context.reset();
          client.reset();
        }
        lost_gone.set_value();
        if (silent) survivors_done.get_future().wait_for(std::chrono::seconds(60));
        return "lost";
      }
      if (gone.wait_for(std::chrono::seconds(30)) != std::future_status::ready)
        return "stuck waiting for the loss";
      context->set_timeout(2.0);
      const auto start = std::chrono::steady_clock::now();
      std::vector<std::int64_t> more{1};
      try {
        context->all_reduce_sum(more);
        ADD_FAILURE() << "summed without group 2";
      } catch (const CommError& e) {
        EXPECT_NE(std::string(e.what()).find("all-reduce over replica groups 0, 1, 2"),
                  std::string::npos)
            << e.what();
      }
      EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
                10.0);
      EXPECT_THROW(context->all_reduce_sum(more), CommError);  // the context is spent
      quorum = client->quorum(1, 10.0);
      EXPECT_EQ(quorum.members, (std::vector<std::int64_t>{0, 1}));
      context = std::make_unique<GroupContext>(address, g, quorum, "shard0", "127.0.0.1", 20.0);
      std::vector<std::int64_t> again{g + 1};
      context->all_reduce_sum(again);
      EXPECT_EQ(again, (std::vector<std::int64_t>{3}));
      return "survived";
    }));
  }
  EXPECT_EQ(groups[0].get(), "survived");
  EXPECT_EQ(groups[1].get(), "survived");
  survivors_done.set_value();
  EXPECT_EQ(groups[2].get(), "lost");
}

TEST(GroupContext, SurvivorsGoOnWhenAMemberDies) {
  lose_a_member(false);
}

TEST(GroupContext, SurvivorsGoOnWhenAMemberFallsSilent) {
  lose_a_member(true);
}

}  // namespace
}  // namespace meshtensor::ft
