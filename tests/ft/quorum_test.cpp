// The coordinator's quorum rules, and the coordinator itself over TCP.
#include <chrono>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/ft/coordinator.hpp>
#include <meshtensor/ft/quorum.hpp>

#include "ft/line_socket.hpp"

namespace meshtensor::ft {
namespace {

RunShape three_groups(std::string fingerprint = "gpt exact 2 fsdp") {
  return {3, 2, std::move(fingerprint)};
}

/// The message of the DataError `join` throws ("" when it joins).
template <typename Join>
std::string refusal(Join join) {
  try {
    join();
  } catch (const DataError& e) {
    return e.what();
  }
  return "";
}

TEST(Quorum, FormsWhenEveryLiveGroupAskedAndHealsTheOnesBehind) {
  QuorumState state({10.0, 1.0});
  for (std::int64_t g = 0; g < 3; ++g)
    state.join(g, "a" + std::to_string(g), three_groups(), 0.0);
  EXPECT_TRUE(state.ask(0, "a0", 7, 0.1));
  EXPECT_TRUE(state.ask(2, "a2", 7, 0.2));
  EXPECT_FALSE(state.form(0.3).has_value());  // group 1 is live and has not asked
  EXPECT_TRUE(state.ask(1, "a1", 3, 0.4));    // a restarted group, behind
  const std::optional<Quorum> q = state.form(0.4);
  ASSERT_TRUE(q.has_value());
  EXPECT_EQ(q->id, 1);
  EXPECT_EQ(q->step, 7);
  EXPECT_EQ(q->members, (std::vector<std::int64_t>{0, 1, 2}));
  EXPECT_EQ(q->heal_from, (std::map<std::int64_t, std::int64_t>{{1, 0}}));
  EXPECT_FALSE(state.form(0.5).has_value());  // the asks were consumed
}

TEST(Quorum, TheFirstRoundWaitsForEveryGroupOfTheRun) {
  QuorumState state({10.0, 1.0});
  state.join(0, "a0", three_groups(), 0.0);
  state.join(1, "a1", three_groups(), 0.0);
  state.ask(0, "a0", 0, 0.1);
  state.ask(1, "a1", 0, 0.1);
  EXPECT_FALSE(state.form(0.2).has_value());  // group 2 has not joined yet
  state.join(2, "a2", three_groups(), 0.3);
  state.ask(2, "a2", 0, 0.4);
  ASSERT_TRUE(state.form(0.4).has_value());
  EXPECT_EQ(state.last().members.size(), 3u);
}

TEST(Quorum, ASilentGroupIsDroppedAndTheRestGoOnAfterTheWait) {
  QuorumState state({10.0, 1.0});
  for (std::int64_t g = 0; g < 3; ++g)
    state.join(g, "a" + std::to_string(g), three_groups(), 0.0);
  state.ask(0, "a0", 4, 5.0);
  state.ask(2, "a2", 4, 5.0);
  state.heartbeat(1, "a1", 5.0);
  EXPECT_FALSE(state.form(5.5).has_value());             // group 1 may still ask
  const std::optional<Quorum> waited = state.form(6.0);  // the wait is over: 2 >= min 2
  ASSERT_TRUE(waited.has_value());
  EXPECT_EQ(waited->members, (std::vector<std::int64_t>{0, 2}));
  // Group 1 stays silent: after its timeout it is no longer live.
  EXPECT_EQ(state.live(), (std::vector<std::int64_t>{0, 1, 2}));
  state.heartbeat(0, "a0", 12.0);
  state.heartbeat(2, "a2", 12.0);
  state.ask(0, "a0", 5, 15.6);
  state.ask(2, "a2", 5, 15.6);
  const std::optional<Quorum> next = state.form(15.6);
  ASSERT_TRUE(next.has_value());  // every live group asked: no wait
  EXPECT_EQ(next->members, (std::vector<std::int64_t>{0, 2}));
  EXPECT_EQ(state.live(), (std::vector<std::int64_t>{0, 2}));
  EXPECT_FALSE(state.heartbeat(1, "a1", 15.7));  // it must join again
  // Below the minimum nothing forms.
  state.leave(2, "a2");
  state.ask(0, "a0", 6, 16.0);
  EXPECT_FALSE(state.form(30.0).has_value());
}

TEST(Quorum, TheIdChangesOnlyWhenTheDataPlaneMust) {
  QuorumState state({10.0, 1.0});
  for (std::int64_t g = 0; g < 3; ++g)
    state.join(g, "a" + std::to_string(g), three_groups(), 0.0);
  const auto round = [&](std::int64_t step, double now, std::vector<bool> fresh = {}) {
    for (std::int64_t g = 0; g < 3; ++g) {
      if (state.live() != std::vector<std::int64_t>{0, 1, 2} && g == 1) continue;
      state.ask(g, "a" + std::to_string(g), step, now,
                !fresh.empty() && fresh[static_cast<std::size_t>(g)]);
    }
    return state.form(now).value();
  };
  const Quorum first = round(0, 0.1);
  const Quorum same = round(1, 0.2);
  EXPECT_EQ(same.id, first.id);  // the same members: their contexts serve on
  EXPECT_EQ(same.round, first.round + 1);
  const Quorum fresh = round(2, 0.3, {false, true, false});
  EXPECT_EQ(fresh.id, first.id + 1);  // group 1's context failed: every member builds anew
  state.leave(1, "a1");
  const Quorum smaller = round(3, 0.4);
  EXPECT_EQ(smaller.id, fresh.id + 1);  // another member set
  EXPECT_EQ(smaller.members, (std::vector<std::int64_t>{0, 2}));
}

TEST(Quorum, GroupsBehindTheRunWaitForTheLiveGroupsAtIt) {
  QuorumState state({10.0, 1.0});
  for (std::int64_t g = 0; g < 3; ++g)
    state.join(g, "a" + std::to_string(g), three_groups(), 0.0);
  for (std::int64_t g = 0; g < 3; ++g)
    state.ask(g, "a" + std::to_string(g), 40, 0.1);
  ASSERT_TRUE(state.form(0.1).has_value());
  // Group 2 restarts at step 0 and asks while 0 and 1 are still in step 40: it does not form a
  // round by waiting, it waits for them.
  state.leave(2, "a2");
  state.join(2, "b2", three_groups(), 0.2);
  state.ask(2, "b2", 0, 0.3);
  state.heartbeat(0, "a0", 5.0);
  state.heartbeat(1, "a1", 5.0);
  EXPECT_FALSE(state.form(5.0).has_value());
  state.ask(0, "a0", 41, 5.1);
  EXPECT_FALSE(state.form(5.2).has_value());  // the wait counts from group 0's ask, not 2's
  const std::optional<Quorum> joined = state.form(6.2);  // 0 is at the run's step: the wait counts
  ASSERT_TRUE(joined.has_value());
  EXPECT_EQ(joined->members, (std::vector<std::int64_t>{0, 2}));
  EXPECT_EQ(joined->step, 41);
  EXPECT_EQ(joined->heal_from, (std::map<std::int64_t, std::int64_t>{{2, 0}}));
}

TEST(Quorum, AnOldConnectionClosingAfterARejoinLeavesTheGroupLive) {
  QuorumState state({2.0, 1.0});
  state.join(0, "a0", three_groups(), 0.0, /*link=*/1);
  state.join(1, "a1", three_groups(), 0.0, 2);
  state.heartbeat(1, "a1", 1.5);
  state.heartbeat(1, "a1", 3.0);  // group 0 was cut off: dropped after its timeout
  EXPECT_EQ(state.live(), (std::vector<std::int64_t>{1}));
  state.join(0, "a0", three_groups(), 3.5, 3);  // back, on a new connection
  state.leave(0, "a0", 1);                      // the old one closes at last
  EXPECT_EQ(state.live(), (std::vector<std::int64_t>{0, 1}));
  state.leave(0, "a0", 3);
  EXPECT_EQ(state.live(), (std::vector<std::int64_t>{1}));
}

TEST(Quorum, ARestartedGroupRejoinsButAGroupLiveTwiceOrOfAnotherRunIsNamed) {
  QuorumState state({10.0, 1.0});
  state.join(0, "first", three_groups(), 0.0);
  EXPECT_NE(refusal([&] {
              state.join(0, "second", three_groups(), 1.0);
            }).find("replica group 0 joined twice"),
            std::string::npos);
  state.leave(0, "first");  // its process died: the connection closed
  state.join(0, "second", three_groups(), 2.0);
  EXPECT_FALSE(state.ask(0, "first", 1, 2.0));
  EXPECT_NE(refusal([&] { state.join(1, "x", three_groups("llama exact 2 tp"), 3.0); })
                .find("another model, layout or settings than the run's groups: 'llama exact 2 tp' "
                      "where they have 'gpt exact 2 fsdp'"),
            std::string::npos);
  EXPECT_NE(refusal([&] {
              state.join(1, "x", RunShape{4, 2, "gpt exact 2 fsdp"}, 3.0);
            }).find("says the run has 4 groups"),
            std::string::npos);
  EXPECT_NE(refusal([&] {
              state.join(3, "x", three_groups(), 3.0);
            }).find("replica group 3 is not one of the run's 3 groups"),
            std::string::npos);
  EXPECT_THROW(QuorumState({0.0, 1.0}), InvalidArgument);
}

TEST(Coordinator, GroupsMeetInAQuorumAndThroughItsStore) {
  Coordinator coordinator({"127.0.0.1", 0, {10.0, 3.0}});
  coordinator.start();
  const std::string address = "127.0.0.1:" + std::to_string(coordinator.port());
  std::vector<std::future<Quorum>> asks;
  for (std::int64_t g = 0; g < 3; ++g) {
    asks.push_back(std::async(std::launch::async, [&, g] {
      CoordinatorClient client(address, g, three_groups(), 5.0);
      client.set("addr/" + std::to_string(g), "host" + std::to_string(g));
      // Every other group's key: all three are live before any asks for a quorum (on a loaded
      // host a late third would otherwise miss a quorum the first two form at once).
      for (const std::int64_t other : {(g + 1) % 3, (g + 2) % 3}) {
        EXPECT_EQ(client.get("addr/" + std::to_string(other), 5.0), "host" + std::to_string(other));
      }
      return client.quorum(g == 1 ? 2 : 9, 10.0);
    }));
  }
  for (auto& ask : asks) {
    const Quorum q = ask.get();
    EXPECT_EQ(q.members, (std::vector<std::int64_t>{0, 1, 2}));
    EXPECT_EQ(q.step, 9);
    EXPECT_EQ(q.heal_from, (std::map<std::int64_t, std::int64_t>{{1, 0}}));
  }
  // While a group of the run is live, a group of another model is refused by name; the
  // coordinator goes on.
  CoordinatorClient live(address, 2, three_groups(), 5.0);
  try {
    CoordinatorClient other(address, 0, three_groups("llama"), 5.0);
    ADD_FAILURE() << "joined";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("'llama' where they have 'gpt exact 2 fsdp'"),
              std::string::npos);
  }
}

TEST(Coordinator, AGroupThatDiesLeavesTheQuorumAtOnce) {
  Coordinator coordinator({"127.0.0.1", 0, {30.0, 0.2}});
  coordinator.start();
  const std::string address = "127.0.0.1:" + std::to_string(coordinator.port());
  CoordinatorClient survivor(address, 0, three_groups(), 5.0);
  {
    CoordinatorClient lost(address, 1, three_groups(), 5.0);
    EXPECT_EQ(coordinator.live_groups(), (std::vector<std::int64_t>{0, 1}));
  }  // its connections close, as when its process is killed
  for (int i = 0; i < 100 && coordinator.live_groups().size() != 1; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(coordinator.live_groups(), (std::vector<std::int64_t>{0}));
  CoordinatorClient other(address, 2, three_groups(), 5.0);
  std::future<Quorum> ask = std::async(std::launch::async, [&] { return other.quorum(4, 5.0); });
  const Quorum q = survivor.quorum(4, 5.0);
  EXPECT_EQ(q.members, (std::vector<std::int64_t>{0, 2}));
  EXPECT_EQ(ask.get().id, q.id);
  // Nobody else is live: a lone group below the minimum of 2 times out, naming its step.
  try {
    survivor.quorum(5, 0.5);
    ADD_FAILURE() << "formed";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("no quorum for step 5"), std::string::npos);
  }
}

TEST(Coordinator, DamagedRequestsGetAnAnswerNamingThemAndTheCoordinatorGoesOn) {
  Coordinator coordinator({"127.0.0.1", 0, {10.0, 1.0}});
  coordinator.start();
  LineSocket raw = LineSocket::connect("127.0.0.1", coordinator.port(), 5.0);
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  for (const std::string& bad :
       {std::string("not json"), std::string("[1, 2]"), std::string("{}"), deep,
        std::string(R"({"op": "join", "group": "zero"})"), std::string(R"({"op": "fly"})"),
        std::string(
            R"({"op": "quorum", "group": 0, "incarnation": "x", "step": 1, "timeout": 1})")}) {
    raw.send_line(bad);
    const std::string reply = raw.read_line(5.0);
    EXPECT_EQ(reply.rfind(R"({"error":)", 0), 0u) << bad.substr(0, 40) << " -> " << reply;
    EXPECT_NE(reply.find(R"("ok":false)"), std::string::npos) << reply;
  }
  // Still serving.
  CoordinatorClient client("127.0.0.1:" + std::to_string(coordinator.port()), 0,
                           {1, 1, "after the damage"}, 5.0);
  EXPECT_EQ(client.quorum(0, 5.0).members, (std::vector<std::int64_t>{0}));
}

}  // namespace
}  // namespace meshtensor::ft
