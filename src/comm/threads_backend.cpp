#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <system_error>
#include <thread>

#include <fmt/format.h>

#include <meshtensor/comm/queued_communicator.hpp>
#include <meshtensor/comm/threads_backend.hpp>
#include <meshtensor/core/error.hpp>
#include <meshtensor/kernels/reduce.hpp>

namespace meshtensor::comm {

namespace detail {

// What one rank posts for the collective in progress. The call and the buffers stay valid until
// the collective's last arrival: the posting rank waits there too.
struct Posting {
  const CollectiveCall* call = nullptr;
  const std::byte* send = nullptr;
  std::byte* recv = nullptr;
  std::int64_t split_color = 0;
  std::int64_t split_key = 0;
};

struct GroupState;

// The world: abort state, every group (to wake their waiters on abort) and the hand-over of
// groups made by split().
struct ThreadsShared {
  ThreadsShared(int world_size, SimulatedNetwork network)
      : size(world_size),
        link(std::move(network.link)),
        topology(network.topology.single_level()
                     ? nullptr
                     : std::make_shared<const Topology>(std::move(network.topology))) {}

  void abort(const std::string& why);
  // Marks `world_rank` as gone (its rank function returned) and wakes every waiter, so that
  // collectives waiting for it fail at once instead of at their deadline.
  void leave(int world_rank);
  bool has_left(std::int64_t world_rank) const {
    return left_count.load() != 0 && left[static_cast<std::size_t>(world_rank)].load();
  }
  std::string abort_reason() {
    const std::lock_guard lock(mutex);
    return reason;
  }
  void add_group(const std::shared_ptr<GroupState>& group) {
    const std::lock_guard lock(mutex);
    groups.push_back(group);
  }
  // What a rank waits in, so that a timeout elsewhere can say a missing member is itself
  // waiting for another rank. The call and ranks stay valid while the slot names them.
  struct Waiting {
    const CollectiveCall* call = nullptr;
    const std::vector<std::int64_t>* group = nullptr;
  };
  void note_waiting(std::int64_t world_rank, Waiting waiting) {
    const std::lock_guard lock(waits_mutex);
    waits[static_cast<std::size_t>(world_rank)] = waiting;
  }
  std::string waiting_text(std::int64_t world_rank) {
    const std::lock_guard lock(waits_mutex);
    const Waiting& w = waits[static_cast<std::size_t>(world_rank)];
    if (w.call == nullptr) return {};
    return fmt::format("{} on group [{}]", w.call->to_string(), fmt::join(*w.group, ","));
  }

  const int size;
  const LinkDelay link;
  const std::shared_ptr<const Topology> topology;
  std::shared_ptr<GroupState> world_group;
  std::atomic<bool> aborted{false};
  std::atomic<int> left_count{0};
  std::mutex mutex;
  std::string reason;
  std::vector<std::atomic<bool>> left =
      std::vector<std::atomic<bool>>(static_cast<std::size_t>(size));
  std::uint64_t next_group_id = 1;
  std::vector<std::weak_ptr<GroupState>> groups;
  std::mutex waits_mutex;
  std::vector<Waiting> waits = std::vector<Waiting>(static_cast<std::size_t>(size));
  // Groups being created by a split: key (parent id, split sequence, color) -> state and the
  // number of members still to pick it up.
  std::map<std::tuple<std::uint64_t, std::int64_t, std::int64_t>,
           std::pair<std::shared_ptr<GroupState>, int>>
      forming;
};

// One group: members, the postings of the collective in progress and a barrier.
struct GroupState {
  GroupState(std::uint64_t group_id, std::vector<std::int64_t> members)
      : id(group_id),
        world_ranks(std::move(members)),
        postings(world_ranks.size()),
        arrived_at(world_ranks.size(), 0) {}

  int size() const { return static_cast<int>(world_ranks.size()); }

  // Blocks until every member arrived, the deadline passed (TimeoutError, and the world aborts
  // so nobody else waits for this group) or the world aborted (CommError with the cause). The
  // last member to arrive runs `on_complete` before the others go on. Waiters sleep until they
  // are woken: by the last arrival, by an abort, or by their deadline.
  //
  // A member that gives up withdraws its arrival and posting under the mutex before it throws,
  // so a later arrival can never complete the group with a call or buffers that are gone; a
  // member that arrives after an abort throws without arriving.
  void arrive_and_wait(int rank, std::chrono::steady_clock::time_point deadline,
                       ThreadsShared& world, const CollectiveCall& call,
                       const std::function<void()>& on_complete = {}) {
    std::unique_lock lock(mutex);
    if (world.aborted.load()) {
      lock.unlock();
      throw aborted_error(call, world);
    }
    const std::uint64_t generation_now = generation;
    if (arrive(rank, generation_now, on_complete)) {
      lock.unlock();
      cv.notify_all();
      return;
    }
    const std::int64_t me = world_ranks[static_cast<std::size_t>(rank)];
    world.note_waiting(me, {&call, &world_ranks});
    struct Cleared {
      ThreadsShared& world;
      std::int64_t me;
      ~Cleared() { world.note_waiting(me, {}); }
    } const cleared{world, me};
    while (generation == generation_now) {
      if (world.aborted.load()) {
        withdraw(rank);
        lock.unlock();
        throw aborted_error(call, world);
      }
      const std::vector<std::int64_t> gone = missing_members(generation_now, world, true);
      if (!gone.empty()) {
        withdraw(rank);
        const std::string message = fmt::format(
            "{} on group [{}] failed: world rank(s) [{}] returned from the rank function without "
            "issuing it (every rank must make the same collective calls)",
            call.to_string(), fmt::join(world_ranks, ","), fmt::join(gone, ","));
        lock.unlock();
        world.abort(message);
        throw CommError(message);
      }
      if (cv.wait_until(lock, deadline) == std::cv_status::timeout &&
          generation == generation_now && !world.aborted.load()) {
        const std::vector<std::int64_t> missing = missing_members(generation_now, world, false);
        withdraw(rank);
        std::string message =
            fmt::format("{} on group [{}] timed out: world rank(s) [{}] never issued it",
                        call.to_string(), fmt::join(world_ranks, ","), fmt::join(missing, ","));
        // A member that never issued it because it waits for a third rank: the cause is further.
        for (const std::int64_t member : missing) {
          const std::string elsewhere = world.waiting_text(member);
          if (!elsewhere.empty())
            message += fmt::format("; world rank {} is itself waiting in {}", member, elsewhere);
        }
        lock.unlock();
        world.abort(message);
        throw TimeoutError(message);
      }
    }
  }

  // Blocks until every member arrived, with no deadline and whatever the world's state: members
  // call it once every member has passed arrive_and_wait() for the same collective and reads or
  // writes the others' buffers, so each of them is on its way here and none may leave (and free
  // its buffers) while another still touches them.
  void release(int rank) {
    std::unique_lock lock(mutex);
    const std::uint64_t generation_now = generation;
    if (arrive(rank, generation_now, {})) {
      lock.unlock();
      cv.notify_all();
      return;
    }
    cv.wait(lock, [&] { return generation != generation_now; });
  }

  // Counts `rank` in; the last arrival runs `on_complete`, opens the next generation and returns
  // true. Called with the mutex held.
  bool arrive(int rank, std::uint64_t generation_now, const std::function<void()>& on_complete) {
    arrived_at[static_cast<std::size_t>(rank)] = generation_now + 1;
    if (++arrived < size()) return false;
    if (on_complete) on_complete();
    arrived = 0;
    ++generation;
    return true;
  }

  // Takes back the arrival of a member that gives up. Called with the mutex held.
  void withdraw(int rank) {
    arrived_at[static_cast<std::size_t>(rank)] = 0;
    postings[static_cast<std::size_t>(rank)] = Posting{};
    --arrived;
  }

  CommError aborted_error(const CollectiveCall& call, ThreadsShared& world) const;

  // The world ranks of the members that have not arrived at `generation_now` (only those that
  // left the world, with `only_left`). Called with the mutex held.
  std::vector<std::int64_t> missing_members(std::uint64_t generation_now,
                                            const ThreadsShared& world, bool only_left) const {
    std::vector<std::int64_t> missing;
    if (only_left && world.left_count.load() == 0) return missing;
    for (std::size_t i = 0; i < arrived_at.size(); ++i) {
      if (arrived_at[i] == generation_now + 1) continue;
      if (!only_left || world.has_left(world_ranks[i])) missing.push_back(world_ranks[i]);
    }
    return missing;
  }

  void wake_all() {
    { const std::lock_guard lock(mutex); }  // a waiter between its check and its wait sees it
    cv.notify_all();
  }

  const std::uint64_t id;
  const std::vector<std::int64_t> world_ranks;
  std::vector<Posting> postings;
  std::string verdict;  // the check of the calls in progress: empty when they match
  std::mutex mutex;
  std::condition_variable cv;
  int arrived = 0;
  std::uint64_t generation = 0;
  std::vector<std::uint64_t> arrived_at;
};

void ThreadsShared::abort(const std::string& why) {
  std::vector<std::shared_ptr<GroupState>> alive;
  {
    const std::lock_guard lock(mutex);
    if (aborted.load()) return;  // the first cause wins
    reason = why;
    aborted.store(true);
    for (const auto& group : groups) {
      if (auto held = group.lock()) alive.push_back(std::move(held));
    }
  }
  for (const auto& group : alive)
    group->wake_all();
}

void ThreadsShared::leave(int world_rank) {
  std::vector<std::shared_ptr<GroupState>> alive;
  {
    const std::lock_guard lock(mutex);
    if (left[static_cast<std::size_t>(world_rank)].exchange(true)) return;
    left_count.fetch_add(1);
    for (const auto& group : groups) {
      if (auto held = group.lock()) alive.push_back(std::move(held));
    }
  }
  for (const auto& group : alive)
    group->wake_all();
}

CommError GroupState::aborted_error(const CollectiveCall& call, ThreadsShared& world) const {
  return CommError(fmt::format("{} on group [{}] failed: the job was aborted: {}", call.to_string(),
                               fmt::join(world_ranks, ","), world.abort_reason()));
}

}  // namespace detail

namespace {

using detail::GroupState;
using detail::Posting;
using detail::ThreadsShared;

class ThreadsCommunicator final : public QueuedCommunicator {
 public:
  ThreadsCommunicator(std::shared_ptr<ThreadsShared> world, std::shared_ptr<GroupState> group,
                      int rank)
      : world_(std::move(world)), group_(std::move(group)), rank_(rank) {}
  ThreadsCommunicator(const ThreadsCommunicator&) = delete;
  ThreadsCommunicator& operator=(const ThreadsCommunicator&) = delete;
  ~ThreadsCommunicator() override { stop_queue(); }

  int rank() const override { return rank_; }
  int size() const override { return group_->size(); }
  const std::vector<std::int64_t>& world_ranks() const override { return group_->world_ranks; }
  std::string_view backend() const override { return "threads"; }
  std::shared_ptr<const Topology> topology() const override { return world_->topology; }
  void throw_if_aborted() const override {
    if (world_->aborted.load()) {
      throw CommError(fmt::format("world rank {} stopped: the job was aborted: {}",
                                  group_->world_ranks[static_cast<std::size_t>(rank_)],
                                  world_->abort_reason()));
    }
  }

 protected:
  void run_collective(const CollectiveCall& call, const Tensor& input, Tensor output,
                      Deadline deadline) override {
    check_still_running(call);
    run_posting(Posting{&call, input.defined() ? input.bytes().data() : nullptr,
                        output.defined() ? output.bytes().data() : nullptr, 0, 0},
                deadline);
  }

  std::shared_ptr<Communicator> run_split(const CollectiveCall& call, std::int64_t color,
                                          std::int64_t key, Deadline deadline) override {
    check_still_running(call);
    const Posting posting{&call, nullptr, nullptr, color, key};
    GroupState& group = *group_;
    post_and_check(posting, deadline);
    const ReleaseOnExit release{group, rank_};
    std::shared_ptr<Communicator> result;
    if (posting.split_color >= 0) {
      // Members: same color, ordered by (key, rank in this group).
      std::vector<std::pair<std::int64_t, int>> members;
      for (int j = 0; j < size(); ++j) {
        const Posting& p = group.postings[static_cast<std::size_t>(j)];
        if (p.split_color == posting.split_color) members.emplace_back(p.split_key, j);
      }
      std::sort(members.begin(), members.end());
      std::vector<std::int64_t> member_world_ranks;
      int new_rank = 0;
      for (std::size_t i = 0; i < members.size(); ++i) {
        member_world_ranks.push_back(
            group.world_ranks[static_cast<std::size_t>(members[i].second)]);
        if (members[i].second == rank_) new_rank = static_cast<int>(i);
      }
      std::shared_ptr<GroupState> state;
      {
        const std::lock_guard lock(world_->mutex);
        auto& entry = world_->forming[{group.id, call.sequence, posting.split_color}];
        if (!entry.first) {
          entry = {std::make_shared<GroupState>(world_->next_group_id++, member_world_ranks),
                   static_cast<int>(members.size())};
          world_->groups.push_back(entry.first);
        }
        state = entry.first;
        if (--entry.second == 0)
          world_->forming.erase({group.id, call.sequence, posting.split_color});
      }
      result = std::make_shared<ThreadsCommunicator>(world_, std::move(state), new_rank);
    }
    return result;
  }

 private:
  // A rank whose function returned has left its run: what it still holds (a DTensor, a group)
  // cannot take part in collectives, whose other members have moved on or left too.
  void check_still_running(const CollectiveCall& call) const {
    const std::int64_t me = group_->world_ranks[static_cast<std::size_t>(rank_)];
    if (world_->has_left(me)) {
      throw CommError(fmt::format(
          "{}: world rank {}'s run has ended (its rank function returned); a communicator or "
          "DTensor of a run cannot be used after the run",
          call.to_string(), me));
    }
  }

  // Posts this rank's call and buffers and waits for every member; the last to arrive checks
  // once that all calls match, and every rank throws the same verdict before anyone touches
  // another rank's buffers.
  void post_and_check(const Posting& posting, std::chrono::steady_clock::time_point deadline) {
    GroupState& group = *group_;
    group.postings[static_cast<std::size_t>(rank_)] = posting;
    const std::function<void()> check = [&group] {
      std::vector<const CollectiveCall*> calls;
      calls.reserve(group.postings.size());
      for (const Posting& p : group.postings)
        calls.push_back(p.call);
      group.verdict.clear();
      try {
        check_calls_match(calls, group.world_ranks);
      } catch (const DesyncError& error) {
        group.verdict = error.what();
      }
    };
    group.arrive_and_wait(rank_, deadline, *world_, *posting.call, check);
    if (!group.verdict.empty()) throw DesyncError(group.verdict);
  }

  // Waits, on every way out of a collective whose postings all members read, until no member
  // touches another's posting any more.
  struct ReleaseOnExit {
    ReleaseOnExit(GroupState& state, int member) : group(state), rank(member) {}
    ReleaseOnExit(const ReleaseOnExit&) = delete;
    ReleaseOnExit& operator=(const ReleaseOnExit&) = delete;
    ~ReleaseOnExit() { group.release(rank); }
    GroupState& group;
    int rank;
  };

  // Post and check, move the data, wait until all are done with each other's buffers.
  void run_posting(const Posting& posting, std::chrono::steady_clock::time_point deadline) {
    GroupState& group = *group_;
    post_and_check(posting, deadline);
    {
      const ReleaseOnExit release{group, rank_};
      try {
        move_data(*posting.call);
      } catch (const std::exception& error) {
        world_->abort(fmt::format("world rank {} failed in {}: {}",
                                  group.world_ranks[static_cast<std::size_t>(rank_)],
                                  posting.call->to_string(), error.what()));
        throw;
      }
    }
    if (world_->link && size() > 1) {
      std::this_thread::sleep_for(world_->link(*posting.call, group.world_ranks));
    }
  }

  void move_data(const CollectiveCall& call) {
    const GroupState& group = *group_;
    const auto k = static_cast<std::size_t>(size());
    const auto me = static_cast<std::size_t>(rank_);
    const std::size_t element = dtype_size(call.dtype);
    switch (call.kind) {
      case CollectiveKind::all_reduce: {
        // Each rank reduces its own range of elements over every buffer and writes the result
        // into every buffer: ranges are disjoint, so no rank touches another's range.
        const std::vector<std::int64_t> counts = balanced_counts(call.count, size());
        const auto begin = static_cast<std::size_t>(displacements(counts)[me]);
        const auto end = begin + static_cast<std::size_t>(counts[me]);
        if (begin == end) return;
        std::vector<const std::byte*> inputs(k);
        std::vector<std::byte*> outputs(k);
        for (std::size_t j = 0; j < k; ++j) {
          inputs[j] = group.postings[j].recv + begin * element;
          outputs[j] = group.postings[j].recv + begin * element;
        }
        reduce_elements(call, inputs, outputs, end - begin);
        return;
      }
      case CollectiveKind::reduce_scatter: {
        const std::vector<std::int64_t> offsets = displacements(call.segment_counts);
        std::vector<const std::byte*> inputs(k);
        for (std::size_t j = 0; j < k; ++j) {
          inputs[j] = group.postings[j].send + static_cast<std::size_t>(offsets[me]) * element;
        }
        std::byte* const output = group.postings[me].recv;
        reduce_elements(call, inputs, std::span<std::byte* const>(&output, 1),
                        static_cast<std::size_t>(call.segment_counts[me]));
        return;
      }
      case CollectiveKind::all_gather: {
        const std::vector<std::int64_t> offsets = displacements(call.segment_counts);
        for (std::size_t j = 0; j < k; ++j) {
          copy(group.postings[me].recv + static_cast<std::size_t>(offsets[j]) * element,
               group.postings[j].send, static_cast<std::size_t>(call.segment_counts[j]) * element);
        }
        return;
      }
      case CollectiveKind::all_to_all: {
        std::int64_t recv_offset = 0;
        for (std::size_t j = 0; j < k; ++j) {
          const std::int64_t count = call.recv_counts[j];
          if (count > 0) {
            // Where this rank's piece starts in sender j's buffer.
            const std::vector<std::int64_t>& sent = group.postings[j].call->send_counts;
            std::int64_t send_offset = 0;
            for (std::size_t i = 0; i < me; ++i)
              send_offset += sent[i];
            copy(group.postings[me].recv + static_cast<std::size_t>(recv_offset) * element,
                 group.postings[j].send + static_cast<std::size_t>(send_offset) * element,
                 static_cast<std::size_t>(count) * element);
          }
          recv_offset += count;
        }
        return;
      }
      case CollectiveKind::broadcast:
        if (call.root != rank_) {
          copy(group.postings[me].recv, group.postings[static_cast<std::size_t>(call.root)].recv,
               static_cast<std::size_t>(call.count) * element);
        }
        return;
      case CollectiveKind::barrier:
      case CollectiveKind::split:
        return;
    }
  }

  static void copy(std::byte* to, const std::byte* from, std::size_t bytes) {
    if (bytes > 0 && to != from) std::memcpy(to, from, bytes);  // equal: an in-place segment
  }

  std::shared_ptr<ThreadsShared> world_;
  std::shared_ptr<GroupState> group_;
  const int rank_;
};

}  // namespace

std::int64_t link_bytes(const CollectiveCall& call, int size) {
  if (size <= 1) return 0;
  const auto element = static_cast<std::int64_t>(dtype_size(call.dtype));
  const auto sum = [](const std::vector<std::int64_t>& counts) {
    std::int64_t total = 0;
    for (const std::int64_t c : counts)
      total += c;
    return total;
  };
  switch (call.kind) {
    case CollectiveKind::all_reduce:
      return 2 * (size - 1) * call.count * element / size;
    case CollectiveKind::reduce_scatter:
    case CollectiveKind::all_gather:
      return (size - 1) * sum(call.segment_counts) * element / size;
    case CollectiveKind::broadcast:
      return call.count * element;
    case CollectiveKind::all_to_all:
      // The larger direction: a member that relays for others sends more than it receives.
      return std::max(sum(call.send_counts), sum(call.recv_counts)) * element * (size - 1) / size;
    case CollectiveKind::barrier:
    case CollectiveKind::split:
      return 0;
  }
  return 0;
}

LinkDelay simulated_link(std::chrono::nanoseconds latency, double bytes_per_second) {
  if (latency.count() < 0 || !(bytes_per_second > 0)) {
    throw InvalidArgument(
        fmt::format("a simulated link needs a latency >= 0 and a bandwidth > 0, "
                    "got {} ns and {} bytes/s",
                    latency.count(), bytes_per_second));
  }
  return [latency, bytes_per_second](const CollectiveCall& call,
                                     const std::vector<std::int64_t>& ranks) {
    const double bytes = static_cast<double>(link_bytes(call, static_cast<int>(ranks.size())));
    return latency + std::chrono::nanoseconds(std::llround(bytes / bytes_per_second * 1e9));
  };
}

LinkDelay simulated_topology_link(const Topology& topology) {
  return [topology](const CollectiveCall& call, const std::vector<std::int64_t>& ranks) {
    const LinkFigures& link = topology.link(topology.level_of(ranks));
    const double bytes = static_cast<double>(link_bytes(call, static_cast<int>(ranks.size())));
    return std::chrono::nanoseconds(
        std::llround((link.latency_s + bytes / link.bandwidth_bytes_s) * 1e9));
  };
}

LinkDelay parse_link(const std::string& text) {
  const LinkFigures link = parse_link_figures(text);
  return simulated_link(std::chrono::nanoseconds(std::llround(link.latency_s * 1e9)),
                        link.bandwidth_bytes_s);
}

ThreadsWorld::ThreadsWorld(int size, SimulatedNetwork network) {
  if (size < 1 || size > kMaxThreadsRanks) {
    throw InvalidArgument(
        fmt::format("a threads world needs 1 to {} ranks, not {}", kMaxThreadsRanks, size));
  }
  if (!network.topology.single_level() && network.topology.ranks() != size) {
    throw InvalidArgument(fmt::format("a topology of {} ranks for a threads world of {}",
                                      network.topology.ranks(), size));
  }
  shared_ = std::make_shared<ThreadsShared>(size, std::move(network));
  std::vector<std::int64_t> members(static_cast<std::size_t>(size));
  for (std::size_t i = 0; i < members.size(); ++i)
    members[i] = static_cast<std::int64_t>(i);
  shared_->world_group = std::make_shared<GroupState>(0, std::move(members));
  shared_->add_group(shared_->world_group);
}

int ThreadsWorld::size() const {
  return shared_->size;
}

std::shared_ptr<Communicator> ThreadsWorld::communicator(int rank) const {
  if (rank < 0 || rank >= size()) {
    throw InvalidArgument(
        fmt::format("rank {} is not in this threads world of {} ranks", rank, size()));
  }
  return std::make_shared<ThreadsCommunicator>(shared_, shared_->world_group, rank);
}

void ThreadsWorld::abort(const std::string& reason) const {
  shared_->abort(reason);
}

void ThreadsWorld::leave(int rank) const {
  if (rank < 0 || rank >= size()) {
    throw InvalidArgument(
        fmt::format("rank {} is not in this threads world of {} ranks", rank, size()));
  }
  shared_->leave(rank);
}

void run_threads(int size, const std::function<void(Communicator&)>& body,
                 SimulatedNetwork network) {
  run_threads(
      size, [&body](const std::shared_ptr<Communicator>& world) { body(*world); },
      std::move(network));
}

void run_threads(int size, const std::function<void(std::shared_ptr<Communicator>)>& body,
                 SimulatedNetwork network) {
  run_threads(size, body, std::move(network), {});
}

namespace {

/// Counts the ranks that finished, for a caller that waits for them while it polls.
struct FinishLine {
  void cross() {
    {
      const std::lock_guard lock(mutex);
      ++finished;
    }
    cv.notify_all();
  }
  /// Waits until `count` ranks finished, calling `poll` between waits of kPollInterval; returns
  /// the exception `poll` threw (the ranks are then still running), or null.
  std::exception_ptr wait(int count, const std::function<void()>& poll) {
    constexpr auto kPollInterval = std::chrono::milliseconds(50);
    std::unique_lock lock(mutex);
    while (finished < count) {
      if (poll) {
        lock.unlock();
        try {
          poll();
        } catch (...) {
          return std::current_exception();
        }
        lock.lock();
      }
      cv.wait_for(lock, kPollInterval, [&] { return finished >= count; });
    }
    return nullptr;
  }

  std::mutex mutex;
  std::condition_variable cv;
  int finished = 0;
};

}  // namespace

void run_threads(int size, const std::function<void(std::shared_ptr<Communicator>)>& body,
                 SimulatedNetwork network, const std::function<void()>& poll) {
  const ThreadsWorld world(size, std::move(network));
  std::vector<std::shared_ptr<Communicator>> communicators;
  for (int rank = 0; rank < size; ++rank)
    communicators.push_back(world.communicator(rank));
  std::mutex first_error_mutex;
  std::exception_ptr first_error;
  FinishLine finish_line;
  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(size));
  // The first error is recorded before the world aborts, so that it is the root cause and not
  // one of the CommErrors the abort raises on the other ranks.
  const auto fail = [&](const std::string& why) {
    {
      const std::lock_guard lock(first_error_mutex);
      if (!first_error) first_error = std::current_exception();
    }
    world.abort(why);
  };
  const auto run_rank = [&](int rank) {
    bool returned = false;
    try {
      body(communicators[static_cast<std::size_t>(rank)]);
      returned = true;
    } catch (const std::exception& error) {
      fail(fmt::format("world rank {} failed: {}", rank, error.what()));
    } catch (...) {
      fail(fmt::format("world rank {} failed with a non-standard exception", rank));
    }
    communicators[static_cast<std::size_t>(rank)].reset();  // drain this rank's queue here
    if (returned) world.leave(rank);
    finish_line.cross();
  };
  for (int rank = 0; rank < size; ++rank) {
    try {
      threads.emplace_back(run_rank, rank);
    } catch (const std::exception& error) {
      // std::system_error, or std::bad_alloc for the thread's own state under a memory limit.
      // The ranks already started would wait for this one: fail them, then report.
      const std::string message = fmt::format(
          "cannot start the thread of rank {} of {} ({}): the process or machine limits the "
          "number of threads; run fewer ranks",
          rank, size, error.what());
      world.abort(message);
      for (std::thread& thread : threads)
        thread.join();
      throw ResourceError(message);
    }
  }
  const std::exception_ptr interrupted = finish_line.wait(size, poll);
  if (interrupted) {
    std::string why = "unknown cause";
    try {
      std::rethrow_exception(interrupted);
    } catch (const std::exception& error) {
      why = error.what();
    } catch (...) {
    }
    world.abort(fmt::format("the run was interrupted: {}", why));
  }
  for (std::thread& thread : threads)
    thread.join();
  if (interrupted) std::rethrow_exception(interrupted);
  if (first_error) std::rethrow_exception(first_error);
}

}  // namespace meshtensor::comm
