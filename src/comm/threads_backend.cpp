#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include <meshtensor/comm/queued_communicator.hpp>
#include <meshtensor/comm/threads_backend.hpp>
#include <meshtensor/core/error.hpp>
#include <meshtensor/kernels/reduce.hpp>

namespace meshtensor::comm {

namespace detail {

// What one rank posts for the collective in progress.
struct Posting {
  CollectiveCall call;
  const std::byte* send = nullptr;
  std::byte* recv = nullptr;
  std::int64_t split_color = 0;
  std::int64_t split_key = 0;
};

struct GroupState;

// The world: abort state and the hand-over of groups made by split().
struct ThreadsShared {
  explicit ThreadsShared(int world_size) : size(world_size) {}

  void abort(const std::string& why) {
    const std::lock_guard lock(mutex);
    if (aborted.load()) return;  // the first cause wins
    reason = why;
    aborted.store(true);
  }
  std::string abort_reason() {
    const std::lock_guard lock(mutex);
    return reason;
  }

  const int size;
  std::shared_ptr<GroupState> world_group;
  std::atomic<bool> aborted{false};
  std::mutex mutex;
  std::string reason;
  std::uint64_t next_group_id = 1;
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
  // so nobody else waits for this group) or the world aborted (CommError with the cause).
  void arrive_and_wait(int rank, std::chrono::steady_clock::time_point deadline,
                       ThreadsShared& world, const CollectiveCall& call) {
    std::unique_lock lock(mutex);
    const std::uint64_t generation_now = generation;
    arrived_at[static_cast<std::size_t>(rank)] = generation_now + 1;
    if (++arrived == size()) {
      arrived = 0;
      ++generation;
      lock.unlock();
      cv.notify_all();
      return;
    }
    while (generation == generation_now) {
      if (world.aborted.load()) {
        throw CommError(fmt::format("{} on group [{}] failed: the job was aborted: {}",
                                    call.to_string(), fmt::join(world_ranks, ","),
                                    world.abort_reason()));
      }
      if (std::chrono::steady_clock::now() >= deadline) {
        std::vector<std::int64_t> missing;
        for (std::size_t i = 0; i < arrived_at.size(); ++i) {
          if (arrived_at[i] != generation_now + 1) missing.push_back(world_ranks[i]);
        }
        const std::string message =
            fmt::format("{} on group [{}] timed out: world rank(s) [{}] never issued it",
                        call.to_string(), fmt::join(world_ranks, ","), fmt::join(missing, ","));
        world.abort(message);
        throw TimeoutError(message);
      }
      // Short slices so an abort elsewhere is noticed promptly.
      cv.wait_for(lock, std::chrono::milliseconds(5));
    }
  }

  const std::uint64_t id;
  const std::vector<std::int64_t> world_ranks;
  std::vector<Posting> postings;
  std::mutex mutex;
  std::condition_variable cv;
  int arrived = 0;
  std::uint64_t generation = 0;
  std::vector<std::uint64_t> arrived_at;
};

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

 protected:
  void run_collective(const CollectiveCall& call, const Tensor& input, Tensor output,
                      Deadline deadline) override {
    run_posting(Posting{call, input.defined() ? input.bytes().data() : nullptr,
                        output.defined() ? output.bytes().data() : nullptr, 0, 0},
                deadline);
  }

  std::shared_ptr<Communicator> run_split(const CollectiveCall& call, std::int64_t color,
                                          std::int64_t key, Deadline deadline) override {
    const Posting posting{call, nullptr, nullptr, color, key};
    GroupState& group = *group_;
    post_and_check(posting, deadline);
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
        auto& entry = world_->forming[{group.id, posting.call.sequence, posting.split_color}];
        if (!entry.first) {
          entry = {std::make_shared<GroupState>(world_->next_group_id++, member_world_ranks),
                   static_cast<int>(members.size())};
        }
        state = entry.first;
        if (--entry.second == 0)
          world_->forming.erase({group.id, posting.call.sequence, posting.split_color});
      }
      result = std::make_shared<ThreadsCommunicator>(world_, std::move(state), new_rank);
    }
    group.arrive_and_wait(rank_, deadline, *world_, posting.call);
    return result;
  }

 private:
  // Posts this rank's call and buffers, waits for every member, and checks that all calls
  // match (the same verdict on every rank) before anyone touches another rank's buffers.
  void post_and_check(const Posting& posting, std::chrono::steady_clock::time_point deadline) {
    GroupState& group = *group_;
    group.postings[static_cast<std::size_t>(rank_)] = posting;
    group.arrive_and_wait(rank_, deadline, *world_, posting.call);
    std::vector<CollectiveCall> calls;
    for (const Posting& p : group.postings)
      calls.push_back(p.call);
    check_calls_match(calls, group.world_ranks);
  }

  // Post and check, move the data, wait until all are done with each other's buffers.
  void run_posting(const Posting& posting, std::chrono::steady_clock::time_point deadline) {
    GroupState& group = *group_;
    post_and_check(posting, deadline);
    try {
      move_data(posting.call);
    } catch (const std::exception& error) {
      world_->abort(fmt::format("world rank {} failed in {}: {}",
                                group.world_ranks[static_cast<std::size_t>(rank_)],
                                posting.call.to_string(), error.what()));
      throw;
    }
    group.arrive_and_wait(rank_, deadline, *world_, posting.call);
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
        const std::vector<std::int64_t> recv_offsets = displacements(call.recv_counts);
        for (std::size_t j = 0; j < k; ++j) {
          const std::vector<std::int64_t> send_offsets =
              displacements(group.postings[j].call.send_counts);
          copy(group.postings[me].recv + static_cast<std::size_t>(recv_offsets[j]) * element,
               group.postings[j].send + static_cast<std::size_t>(send_offsets[me]) * element,
               static_cast<std::size_t>(call.recv_counts[j]) * element);
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

ThreadsWorld::ThreadsWorld(int size) {
  if (size < 1 || size > 4096) {
    throw InvalidArgument(fmt::format("a threads world needs 1 to 4096 ranks, not {}", size));
  }
  shared_ = std::make_shared<ThreadsShared>(size);
  std::vector<std::int64_t> members(static_cast<std::size_t>(size));
  for (std::size_t i = 0; i < members.size(); ++i)
    members[i] = static_cast<std::int64_t>(i);
  shared_->world_group = std::make_shared<GroupState>(0, std::move(members));
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

void run_threads(int size, const std::function<void(Communicator&)>& body) {
  const ThreadsWorld world(size);
  std::vector<std::shared_ptr<Communicator>> communicators;
  for (int rank = 0; rank < size; ++rank)
    communicators.push_back(world.communicator(rank));
  std::mutex first_error_mutex;
  std::exception_ptr first_error;
  std::vector<std::thread> threads;
  for (int rank = 0; rank < size; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        body(*communicators[static_cast<std::size_t>(rank)]);
      } catch (const std::exception& error) {
        world.abort(fmt::format("world rank {} failed: {}", rank, error.what()));
        const std::lock_guard lock(first_error_mutex);
        if (!first_error) first_error = std::current_exception();
      } catch (...) {
        world.abort(fmt::format("world rank {} failed with a non-standard exception", rank));
        const std::lock_guard lock(first_error_mutex);
        if (!first_error) first_error = std::current_exception();
      }
      communicators[static_cast<std::size_t>(rank)]
          .reset();  // drain this rank's queue on its thread
    });
  }
  for (std::thread& thread : threads)
    thread.join();
  if (first_error) std::rethrow_exception(first_error);
}

}  // namespace meshtensor::comm
