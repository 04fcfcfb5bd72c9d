#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iostream>
#include <map>
#include <mutex>
#include <thread>

#include <climits>
#include <fmt/format.h>
#include <mpi.h>

#include <meshtensor/comm/mpi_backend.hpp>
#include <meshtensor/comm/queued_communicator.hpp>
#include <meshtensor/core/error.hpp>
#include <meshtensor/core/random.hpp>
#include <meshtensor/kernels/elementwise.hpp>
#include <meshtensor/kernels/reduce.hpp>

#include "abort_enforcer.hpp"

namespace meshtensor::comm {

namespace detail {

/// How long mpirun has to end the job after an abort before the rank's helper ends mpirun.
constexpr int kAbortGraceSeconds = 10;

// Job-wide state: options, the abort path, the timeout watchdog and the answers to other
// ranks' questions about this rank's progress.
//
// When a collective outlives its timeout, the watchdog asks every other member of the group,
// over a communicator of its own, how many calls it has issued on that group; the members'
// watchdogs answer even while their ranks are blocked elsewhere. Members that issued fewer calls
// never issued this one; members that do not answer within a grace period are stopped, hung or
// dead. The job then aborts with that diagnosis.
struct MpiShared {
  // One collective in flight.
  struct Watch {
    std::chrono::steady_clock::time_point deadline;
    std::chrono::milliseconds timeout{0};
    std::uint64_t group = 0;  // key of the group, the same on every member
    std::int64_t sequence = 0;
    const std::vector<std::int64_t>* members = nullptr;  // world ranks
    std::int64_t me = 0;
    std::function<std::string()> describe;  // "<call> on group [..] (world rank r)"
    const CollectiveCall* call = nullptr;
  };

  std::shared_ptr<const Topology> topology;  // detected at start; null on one host

  MpiShared(bool check, MPI_Comm control_comm) : check_collectives(check), control(control_comm) {
    watchdog_ = std::thread([this] { watch(); });
  }
  ~MpiShared() { stop_watchdog(); }

  [[noreturn]] void abort(const std::string& message, int status = 1) {
    {
      const std::lock_guard lock(abort_mutex_);  // one error line, even if several threads fail
      std::cerr << "meshtensor: error: " << message << std::endl;
    }
    enforce_abort(std::chrono::seconds(kAbortGraceSeconds));
    MPI_Abort(MPI_COMM_WORLD, status);
    std::_Exit(status);  // MPI_Abort does not return; this keeps [[noreturn]] honest
  }

  // Progress of a group this rank belongs to: `issued()` is the number of calls it has issued.
  void register_group(std::uint64_t key, std::function<std::int64_t()> issued) {
    const std::lock_guard lock(watch_mutex_);
    groups_[key] = std::move(issued);
  }
  void unregister_group(std::uint64_t key) {
    const std::lock_guard lock(watch_mutex_);
    groups_.erase(key);
  }

  // The watchdog aborts the job once the deadline passed. `watch.describe` and `watch.members`
  // must stay valid until watch_end.
  std::uint64_t watch_start(Watch watch) {
    const std::lock_guard lock(watch_mutex_);
    const std::uint64_t id = next_watch_id_++;
    in_flight_.emplace(id, std::move(watch));
    return id;
  }
  void watch_end(std::uint64_t id) {
    const std::lock_guard lock(watch_mutex_);
    in_flight_.erase(id);
  }

  void stop_watchdog() {
    {
      const std::lock_guard lock(watch_mutex_);
      stopping_ = true;
    }
    watch_cv_.notify_all();
    if (watchdog_.joinable()) watchdog_.join();
  }

  const bool check_collectives;
  const MPI_Comm control;  // the watchdogs' own communicator
  std::atomic<bool> finalized{false};

 private:
  static constexpr int kQueryTag = 1;
  static constexpr int kReplyTag = 2;
  static constexpr int kReplyTextTag = 3;
  // Separates, in a reply's text, the call on the asked group from one on another group.
  static constexpr char kElsewhere = '\x1f';

  void watch() {
    std::unique_lock lock(watch_mutex_);
    while (!stopping_) {
      watch_cv_.wait_for(lock, std::chrono::milliseconds(20));
      serve_queries(lock);
      const auto now = std::chrono::steady_clock::now();
      for (const auto& [id, entry] : in_flight_) {
        if (now >= entry.deadline) {
          const std::string message = diagnose(entry, lock);
          lock.unlock();
          abort(message);
        }
      }
    }
  }

  // Answers the questions other ranks' watchdogs sent: (group key, sequence) -> (group key,
  // calls issued on that group, or -1 for a group this rank is not in), then the call this rank
  // is in on that group, as text (empty when none).
  void serve_queries(std::unique_lock<std::mutex>& lock) {
    while (true) {
      int pending = 0;
      MPI_Status status;
      if (MPI_Iprobe(MPI_ANY_SOURCE, kQueryTag, control, &pending, &status) != MPI_SUCCESS ||
          pending == 0) {
        return;
      }
      std::int64_t query[2] = {0, 0};
      MPI_Recv(query, 2, MPI_INT64_T, status.MPI_SOURCE, kQueryTag, control, MPI_STATUS_IGNORE);
      // The group, the calls this rank issued on it, and the sequence of the one it is in.
      std::int64_t reply[3] = {query[0], -1, -1};
      const auto found = groups_.find(static_cast<std::uint64_t>(query[0]));
      if (found != groups_.end()) reply[1] = found->second();
      std::string doing;
      std::string elsewhere;  // a call this rank waits in on another group
      for (const auto& [id, entry] : in_flight_) {
        if (entry.group == static_cast<std::uint64_t>(query[0])) {
          doing = entry.call->match_key();
          reply[2] = entry.call->sequence;
        } else if (elsewhere.empty()) {
          elsewhere = entry.describe();
        }
      }
      doing += kElsewhere + elsewhere;
      lock.unlock();
      MPI_Send(reply, 3, MPI_INT64_T, status.MPI_SOURCE, kReplyTag, control);
      MPI_Send(doing.data(), static_cast<int>(doing.size()), MPI_CHAR, status.MPI_SOURCE,
               kReplyTextTag, control);
      lock.lock();
    }
  }

  // Asks every other member how far it got, then names who never issued the call and who did
  // not answer.
  std::string diagnose(const Watch& watch, std::unique_lock<std::mutex>& lock) {
    std::map<std::int64_t, std::int64_t> issued;  // world rank -> calls issued (-1: not a member)
    std::map<std::int64_t, std::string> doing;    // world rank -> the call it is in, if any
    std::map<std::int64_t, std::int64_t> doing_sequence;  // world rank -> that call's sequence
    std::map<std::int64_t, std::string> waiting;  // world rank -> a call it waits in elsewhere
    for (std::int64_t member : *watch.members) {
      if (member == watch.me) continue;
      const std::int64_t query[2] = {static_cast<std::int64_t>(watch.group), watch.sequence};
      MPI_Send(query, 2, MPI_INT64_T, static_cast<int>(member), kQueryTag, control);
    }
    const auto grace = std::clamp<std::chrono::milliseconds>(
        watch.timeout / 4, std::chrono::milliseconds(200), std::chrono::milliseconds(2000));
    const auto give_up = std::chrono::steady_clock::now() + grace;
    const std::size_t expected = watch.members->size() - 1;
    while (issued.size() < expected && std::chrono::steady_clock::now() < give_up) {
      serve_queries(lock);
      int pending = 0;
      MPI_Status status;
      if (MPI_Iprobe(MPI_ANY_SOURCE, kReplyTag, control, &pending, &status) == MPI_SUCCESS &&
          pending != 0) {
        std::int64_t reply[3] = {0, 0, -1};
        MPI_Recv(reply, 3, MPI_INT64_T, status.MPI_SOURCE, kReplyTag, control, MPI_STATUS_IGNORE);
        MPI_Status text_status;
        MPI_Probe(status.MPI_SOURCE, kReplyTextTag, control, &text_status);
        int length = 0;
        MPI_Get_count(&text_status, MPI_CHAR, &length);
        std::string text(static_cast<std::size_t>(length), '\0');
        MPI_Recv(text.data(), length, MPI_CHAR, status.MPI_SOURCE, kReplyTextTag, control,
                 MPI_STATUS_IGNORE);
        if (reply[0] == static_cast<std::int64_t>(watch.group)) {
          const std::size_t split = text.find(kElsewhere);
          issued[status.MPI_SOURCE] = reply[1];
          if (split != std::string::npos) waiting[status.MPI_SOURCE] = text.substr(split + 1);
          doing[status.MPI_SOURCE] = text.substr(0, split);
          doing_sequence[status.MPI_SOURCE] = reply[2];
        }
        continue;
      }
      lock.unlock();
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      lock.lock();
    }
    std::vector<std::int64_t> missing;
    std::vector<std::int64_t> silent;
    std::vector<std::string> other_calls;
    std::vector<std::string> ahead;
    const std::string mine = watch.call->match_key();
    for (std::int64_t member : *watch.members) {
      if (member == watch.me) continue;
      const auto found = issued.find(member);
      if (found == issued.end()) {
        silent.push_back(member);
      } else if (found->second <= watch.sequence) {
        missing.push_back(member);
      } else if (doing_sequence[member] == watch.sequence && doing[member] != mine) {
        // It is in the call at this position, but not this one: the ranks disagree.
        other_calls.push_back(fmt::format("world rank {} is in {}", member, doing[member]));
      } else if (doing_sequence[member] > watch.sequence) {
        ahead.push_back(
            fmt::format("world rank {} finished its part and is in {}", member, doing[member]));
      }
    }
    // The ranks that stopped first: they are the likely cause.
    std::string why;
    const auto add = [&why](const std::string& part) {
      why += fmt::format("{}{}", why.empty() ? "" : "; ", part);
    };
    if (!silent.empty()) {
      add(fmt::format("world rank(s) [{}] did not answer within {} ms (stopped, hung or dead)",
                      fmt::join(silent, ","), grace.count()));
    }
    if (!missing.empty())
      add(fmt::format("world rank(s) [{}] never issued it", fmt::join(missing, ",")));
    // A member that never issued it because it waits for a third rank: the cause is further on.
    for (const std::int64_t member : missing) {
      if (!waiting[member].empty())
        add(fmt::format("world rank {} is itself waiting in {}", member, waiting[member]));
    }
    if (!other_calls.empty())
      add(fmt::format("the ranks issued different calls: {}", fmt::join(other_calls, "; ")));
    if (!ahead.empty()) add(fmt::format("{}", fmt::join(ahead, "; ")));
    if (why.empty()) why = "every member issued it, but it did not complete";
    return fmt::format("{} timed out after {} ms: {}", watch.describe(), watch.timeout.count(),
                       why);
  }

  std::mutex abort_mutex_;
  std::mutex watch_mutex_;
  std::condition_variable watch_cv_;
  bool stopping_ = false;
  std::uint64_t next_watch_id_ = 0;
  std::map<std::uint64_t, Watch> in_flight_;
  std::map<std::uint64_t, std::function<std::int64_t()>> groups_;
  std::thread watchdog_;
};

}  // namespace detail

namespace {
using detail::MpiShared;

// Largest element count one MPI call takes (its counts are int).
constexpr std::int64_t kMaxMpiCount = INT_MAX;
// all_reduce moves messages in pieces of at most this many elements.
constexpr std::int64_t kAllReduceChunk = std::int64_t{1} << 26;
// Ordered and exact all_reduces of at most this many bytes per rank gather every rank's buffer
// (with an 8-byte fingerprint of the call).
constexpr std::size_t kGatherAllBytes = 512;
// Staging for one round of reduce_to_owners (all peers' chunks together), and the least a chunk
// from one peer holds: small enough to stay in cache until it is reduced, big enough that a round
// is not mostly message set-up and waiting (with many peers, rounds of small chunks measured
// slower than MPI's own all_reduce; 256 KiB per round with one peer, 128 KiB per peer with more).
constexpr std::int64_t kStagingBytes = std::int64_t{256} << 10;
constexpr std::int64_t kMinChunkBytes = std::int64_t{128} << 10;
// Tags of reduce_to_owners' messages (the communicator is the backend's own). They carry the
// call's mode and op: ranks that disagree on them never combine each other's data (their
// messages do not match; the timeout names what each rank is in).
constexpr int kReduceTagBase = 16;
int reduce_tag(const CollectiveCall& call) {
  return kReduceTagBase + static_cast<int>(call.mode) * 8 + static_cast<int>(call.op);
}
// Key of the world group (split groups derive theirs from it).
constexpr std::uint64_t kWorldKey = 1;

void check_mpi(int code, const char* what) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  throw CommError(
      fmt::format("{} failed: {}", what, std::string(text, static_cast<std::size_t>(length))));
}

MPI_Datatype mpi_type(DType dtype) {
  switch (dtype) {
    case DType::f64:
      return MPI_DOUBLE;
    case DType::f32:
      return MPI_FLOAT;
    case DType::bf16:
    case DType::f16:
      return MPI_UINT16_T;  // moved as bits; reductions of halves never use MPI's ops
    case DType::i64:
      return MPI_INT64_T;
    case DType::i32:
      return MPI_INT32_T;
    case DType::u8:
      return MPI_UINT8_T;
  }
  throw InvalidArgument("invalid dtype");
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg:
      return MPI_SUM;
    case ReduceOp::max:
      return MPI_MAX;
    case ReduceOp::min:
      return MPI_MIN;
  }
  throw InvalidArgument("invalid reduce op");
}

// MPI's own reductions serve `native` mode where MPI has the type; halves always go ordered.
bool use_mpi_reduction(const CollectiveCall& call) {
  return call.mode == ReductionMode::native && call.dtype != DType::bf16 &&
         call.dtype != DType::f16;
}

int to_int(std::int64_t value, const CollectiveCall& call) {
  if (value > kMaxMpiCount) {
    throw CommError(fmt::format("{}: {} elements exceed the mpi backend's limit of {} per call",
                                call.to_string(), value, kMaxMpiCount));
  }
  return static_cast<int>(value);
}

std::vector<int> to_ints(const std::vector<std::int64_t>& values, const CollectiveCall& call) {
  std::vector<int> result;
  result.reserve(values.size());
  for (std::int64_t v : values)
    result.push_back(to_int(v, call));
  return result;
}

// Flat form of a call for the check-mode exchange.
std::vector<std::int64_t> serialize(const CollectiveCall& call) {
  std::vector<std::int64_t> out = {static_cast<std::int64_t>(call.kind),
                                   call.sequence,
                                   static_cast<std::int64_t>(call.dtype),
                                   static_cast<std::int64_t>(call.op),
                                   static_cast<std::int64_t>(call.mode),
                                   call.root,
                                   call.count};
  for (const auto* counts : {&call.segment_counts, &call.send_counts, &call.recv_counts}) {
    out.push_back(static_cast<std::int64_t>(counts->size()));
    out.insert(out.end(), counts->begin(), counts->end());
  }
  out.push_back(static_cast<std::int64_t>(call.label.size()));
  for (const char c : call.label)
    out.push_back(static_cast<unsigned char>(c));
  return out;
}

CollectiveCall deserialize(std::span<const std::int64_t> in) {
  CollectiveCall call;
  call.kind = static_cast<CollectiveKind>(in[0]);
  call.sequence = in[1];
  call.dtype = static_cast<DType>(in[2]);
  call.op = static_cast<ReduceOp>(in[3]);
  call.mode = static_cast<ReductionMode>(in[4]);
  call.root = static_cast<int>(in[5]);
  call.count = in[6];
  std::size_t at = 7;
  for (auto* counts : {&call.segment_counts, &call.send_counts, &call.recv_counts}) {
    const auto n = static_cast<std::size_t>(in[at++]);
    counts->assign(in.begin() + static_cast<std::ptrdiff_t>(at),
                   in.begin() + static_cast<std::ptrdiff_t>(at + n));
    at += n;
  }
  const auto label_size = static_cast<std::size_t>(in[at++]);
  for (std::size_t i = 0; i < label_size; ++i)
    call.label.push_back(static_cast<char>(in[at + i]));
  return call;
}

class MpiCommunicator final : public QueuedCommunicator {
 public:
  MpiCommunicator(std::shared_ptr<MpiShared> shared, MPI_Comm comm, bool owns_comm,
                  std::uint64_t key)
      : shared_(std::move(shared)), comm_(comm), owns_comm_(owns_comm), key_(key) {
    check_mpi(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
    check_mpi(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
    // Members' world ranks, in group order.
    MPI_Group group = MPI_GROUP_NULL;
    MPI_Group world_group = MPI_GROUP_NULL;
    check_mpi(MPI_Comm_group(comm_, &group), "MPI_Comm_group");
    check_mpi(MPI_Comm_group(MPI_COMM_WORLD, &world_group), "MPI_Comm_group");
    std::vector<int> positions(static_cast<std::size_t>(size_));
    std::vector<int> translated(static_cast<std::size_t>(size_));
    for (int i = 0; i < size_; ++i)
      positions[static_cast<std::size_t>(i)] = i;
    check_mpi(
        MPI_Group_translate_ranks(group, size_, positions.data(), world_group, translated.data()),
        "MPI_Group_translate_ranks");
    MPI_Group_free(&group);
    MPI_Group_free(&world_group);
    world_ranks_.assign(translated.begin(), translated.end());
    shared_->register_group(key_, [this] { return issued_calls(); });
  }
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;
  ~MpiCommunicator() override {
    stop_queue();
    shared_->unregister_group(key_);
    if (owns_comm_ && !shared_->finalized.load()) MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::vector<std::int64_t>& world_ranks() const override { return world_ranks_; }
  std::string_view backend() const override { return "mpi"; }
  std::shared_ptr<const Topology> topology() const override { return shared_->topology; }

 protected:
  void run_collective(const CollectiveCall& call, const Tensor& input, Tensor output,
                      Deadline deadline) override {
    guarded(call, deadline, [&] {
      if (shared_->check_collectives) check_fingerprints(call);
      move_data(call, input, output);
    });
  }

  std::shared_ptr<Communicator> run_split(const CollectiveCall& call, std::int64_t color,
                                          std::int64_t key, Deadline deadline) override {
    std::shared_ptr<Communicator> result;
    guarded(call, deadline, [&] {
      if (shared_->check_collectives) check_fingerprints(call);
      if (color > INT_MAX || key > INT_MAX || key < INT_MIN) {
        throw CommError(
            fmt::format("split: color {} or key {} does not fit MPI's int", color, key));
      }
      MPI_Comm created = MPI_COMM_NULL;
      check_mpi(MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : static_cast<int>(color),
                               static_cast<int>(key), &created),
                "MPI_Comm_split");
      if (created != MPI_COMM_NULL) {
        // The same key on every member: derived from the parent's, the call and the color.
        const std::uint64_t group_key =
            mix64(key_ ^ mix64(static_cast<std::uint64_t>(call.sequence) ^
                               mix64(static_cast<std::uint64_t>(color))));
        result = std::make_shared<MpiCommunicator>(shared_, created, true, group_key);
      }
    });
    return result;
  }

 private:
  // Runs `step` under the watchdog; any failure aborts the job with its message (other ranks
  // may already be inside the next collective, so carrying on could only hang).
  template <class Step>
  void guarded(const CollectiveCall& call, Deadline deadline, Step&& step) {
    // Messages are built only on failure: this runs for every collective.
    const auto where = [&] {
      return fmt::format("{} on group [{}] (world rank {})", call.to_string(),
                         fmt::join(world_ranks_, ","),
                         world_ranks_[static_cast<std::size_t>(rank_)]);
    };
    const auto now = std::chrono::steady_clock::now();
    const std::uint64_t watch = shared_->watch_start(
        {deadline, std::chrono::ceil<std::chrono::milliseconds>(deadline - now), key_,
         call.sequence, &world_ranks_, world_ranks_[static_cast<std::size_t>(rank_)], where,
         &call});
    try {
      step();
    } catch (const std::exception& error) {
      shared_->abort(fmt::format("{} failed: {}", where(), error.what()));
    }
    shared_->watch_end(watch);
  }

  // Check mode: every member's call, compared with the same verdict on every rank.
  void check_fingerprints(const CollectiveCall& call) {
    const std::vector<std::int64_t> mine = serialize(call);
    const int length = static_cast<int>(mine.size());
    std::vector<int> lengths(static_cast<std::size_t>(size_));
    check_mpi(MPI_Allgather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, comm_),
              "MPI_Allgather");
    std::vector<int> offsets(static_cast<std::size_t>(size_), 0);
    for (std::size_t i = 1; i < offsets.size(); ++i)
      offsets[i] = offsets[i - 1] + lengths[i - 1];
    std::vector<std::int64_t> all(static_cast<std::size_t>(offsets.back() + lengths.back()));
    check_mpi(MPI_Allgatherv(mine.data(), length, MPI_INT64_T, all.data(), lengths.data(),
                             offsets.data(), MPI_INT64_T, comm_),
              "MPI_Allgatherv");
    std::vector<CollectiveCall> calls;
    for (int i = 0; i < size_; ++i) {
      const auto at = static_cast<std::size_t>(i);
      calls.push_back(deserialize(std::span<const std::int64_t>(all).subspan(
          static_cast<std::size_t>(offsets[at]), static_cast<std::size_t>(lengths[at]))));
    }
    std::vector<const CollectiveCall*> pointers;
    for (const CollectiveCall& one : calls)
      pointers.push_back(&one);
    check_calls_match(pointers, world_ranks_);
  }

  void move_data(const CollectiveCall& call, const Tensor& input, Tensor& output) {
    const MPI_Datatype type = mpi_type(call.dtype);
    switch (call.kind) {
      case CollectiveKind::all_reduce:
        run_all_reduce(call, output);
        return;
      case CollectiveKind::reduce_scatter:
        if (use_mpi_reduction(call)) {
          const std::vector<int> counts = to_ints(call.segment_counts, call);
          check_mpi(MPI_Reduce_scatter(input.bytes().data(), output.bytes().data(), counts.data(),
                                       type, mpi_op(call.op), comm_),
                    "MPI_Reduce_scatter");
          if (call.op == ReduceOp::avg) kernels::divide(output, size_);
        } else {
          reduce_to_owners(call, input.bytes().data(), call.segment_counts, output.bytes().data());
        }
        return;
      case CollectiveKind::all_gather: {
        const std::vector<int> counts = to_ints(call.segment_counts, call);
        const std::vector<int> offsets = to_ints(displacements(call.segment_counts), call);
        std::byte* out = output.bytes().data();
        const std::byte* in = input.bytes().data();
        const bool in_place =
            in == out + static_cast<std::size_t>(offsets[static_cast<std::size_t>(rank_)]) *
                            dtype_size(call.dtype);
        check_mpi(
            MPI_Allgatherv(in_place ? MPI_IN_PLACE : in, counts[static_cast<std::size_t>(rank_)],
                           type, out, counts.data(), offsets.data(), type, comm_),
            "MPI_Allgatherv");
        return;
      }
      case CollectiveKind::all_to_all: {
        const std::vector<int> send = to_ints(call.send_counts, call);
        const std::vector<int> recv = to_ints(call.recv_counts, call);
        const std::vector<int> send_offsets = to_ints(displacements(call.send_counts), call);
        const std::vector<int> recv_offsets = to_ints(displacements(call.recv_counts), call);
        check_mpi(
            MPI_Alltoallv(input.bytes().data(), send.data(), send_offsets.data(), type,
                          output.bytes().data(), recv.data(), recv_offsets.data(), type, comm_),
            "MPI_Alltoallv");
        return;
      }
      case CollectiveKind::broadcast:
        check_mpi(
            MPI_Bcast(output.bytes().data(), to_int(call.count, call), type, call.root, comm_),
            "MPI_Bcast");
        return;
      case CollectiveKind::barrier:
        check_mpi(MPI_Barrier(comm_), "MPI_Barrier");
        return;
      case CollectiveKind::split:
        return;
    }
  }

  void run_all_reduce(const CollectiveCall& call, Tensor& buffer) {
    const std::size_t element = dtype_size(call.dtype);
    std::byte* data = buffer.bytes().data();
    for (std::int64_t begin = 0; begin < call.count; begin += kAllReduceChunk) {
      const std::int64_t n = std::min(kAllReduceChunk, call.count - begin);
      std::byte* chunk = data + static_cast<std::size_t>(begin) * element;
      if (use_mpi_reduction(call)) {
        check_mpi(MPI_Allreduce(MPI_IN_PLACE, chunk, static_cast<int>(n), mpi_type(call.dtype),
                                mpi_op(call.op), comm_),
                  "MPI_Allreduce");
      } else if (static_cast<std::size_t>(n) * element <= kGatherAllBytes) {
        gather_all_and_reduce(call, chunk, n);
      } else {
        // Each rank reduces its balanced share in ascending rank order, then all gather.
        const std::vector<std::int64_t> counts = balanced_counts(n, size_);
        const std::vector<std::int64_t> offsets = displacements(counts);
        const auto me = static_cast<std::size_t>(rank_);
        reduce_to_owners(call, chunk, counts,
                         chunk + static_cast<std::size_t>(offsets[me]) * element);
        gather_owned(call, chunk, counts, offsets);
      }
    }
    if (use_mpi_reduction(call) && call.op == ReduceOp::avg) kernels::divide(buffer, size_);
  }

  // Every rank's owned segment of `buffer` to every rank, in place. Equal segments take
  // MPI_Allgather, which MPI implements faster than the v-variant.
  void gather_owned(const CollectiveCall& call, std::byte* buffer,
                    const std::vector<std::int64_t>& counts,
                    const std::vector<std::int64_t>& offsets) {
    const MPI_Datatype type = mpi_type(call.dtype);
    const auto me = static_cast<std::size_t>(rank_);
    if (std::all_of(counts.begin(), counts.end(),
                    [&](std::int64_t count) { return count == counts.front(); })) {
      const int count = to_int(counts.front(), call);
      check_mpi(MPI_Allgather(MPI_IN_PLACE, count, type, buffer, count, type, comm_),
                "MPI_Allgather");
      return;
    }
    const std::vector<int> int_counts = to_ints(counts, call);
    const std::vector<int> int_offsets = to_ints(offsets, call);
    check_mpi(MPI_Allgatherv(MPI_IN_PLACE, int_counts[me], type, buffer, int_counts.data(),
                             int_offsets.data(), type, comm_),
              "MPI_Allgatherv");
  }

  // Small buffers: one all_gather brings every rank's whole buffer here and each rank combines
  // them all itself, in group-rank order (the same reduction, so the same bits, as the owners'):
  // one latency instead of two.
  void gather_all_and_reduce(const CollectiveCall& call, std::byte* buffer, std::int64_t count) {
    // Each rank's buffer travels behind a fingerprint of its call: ranks that issued different
    // calls here (another mode, op, dtype or count) find out at once, all of them, instead of
    // combining mismatched data.
    constexpr std::size_t kHeader = sizeof(std::uint64_t);
    const std::size_t bytes = static_cast<std::size_t>(count) * dtype_size(call.dtype);
    const std::size_t slot = kHeader + bytes;
    std::byte* const gathered = staging(slot * static_cast<std::size_t>(size_ + 1));
    std::byte* const own = gathered + slot * static_cast<std::size_t>(size_);
    const std::uint64_t fingerprint = call_fingerprint(call);
    std::memcpy(own, &fingerprint, kHeader);
    std::memcpy(own + kHeader, buffer, bytes);
    check_mpi(MPI_Allgather(own, static_cast<int>(slot), MPI_BYTE, gathered, static_cast<int>(slot),
                            MPI_BYTE, comm_),
              "MPI_Allgather");
    std::vector<const std::byte*> inputs(static_cast<std::size_t>(size_));
    for (std::size_t j = 0; j < inputs.size(); ++j) {
      std::uint64_t theirs = 0;
      std::memcpy(&theirs, gathered + j * slot, kHeader);
      if (theirs != fingerprint) {
        throw DesyncError(fmt::format(
            "collectives do not match: group rank {} (world rank {}) issued {}, but group rank {} "
            "(world rank {}) issued another call at this position (a different mode, op, dtype "
            "or count)",
            rank_, world_ranks_[static_cast<std::size_t>(rank_)], call.to_string(), j,
            world_ranks_[j]));
      }
      inputs[j] = gathered + j * slot + kHeader;
    }
    reduce_elements(call, inputs, std::span<std::byte* const>(&buffer, 1),
                    static_cast<std::size_t>(count));
  }

  // Fingerprint of the fields a small all_reduce's ranks must agree on (cheap: it is on every
  // call's path).
  static std::uint64_t call_fingerprint(const CollectiveCall& call) {
    std::uint64_t value = mix64(static_cast<std::uint64_t>(call.sequence));
    for (const std::uint64_t field :
         {static_cast<std::uint64_t>(call.kind), static_cast<std::uint64_t>(call.dtype),
          static_cast<std::uint64_t>(call.op), static_cast<std::uint64_t>(call.mode),
          static_cast<std::uint64_t>(call.count),
          static_cast<std::uint64_t>(std::hash<std::string>{}(call.label))}) {
      value = mix64(value ^ field);
    }
    return value;
  }

  // Segment i of `input` (counts[i] elements, back to back) is reduced over all ranks into rank
  // i's `output` (which may be the segment's own place in `input`). Point to point, in rounds:
  // in round c every rank sends chunk c of each other segment to its owner and receives every
  // other rank's chunk c of its own segment into a staging area small enough to stay in cache,
  // then combines them with its own copy, in group-rank order (reduce_elements). A rank's own
  // copy is read in place, never sent; sends from earlier rounds complete while later ones run.
  void reduce_to_owners(const CollectiveCall& call, const std::byte* input,
                        const std::vector<std::int64_t>& counts, std::byte* output) {
    const std::size_t element = dtype_size(call.dtype);
    const MPI_Datatype type = mpi_type(call.dtype);
    const auto me = static_cast<std::size_t>(rank_);
    const auto peers = static_cast<std::int64_t>(size_ - 1);
    const std::vector<std::int64_t> offsets = displacements(counts);
    std::int64_t chunk = std::max<std::int64_t>(
        kMinChunkBytes / static_cast<std::int64_t>(element),
        kStagingBytes / std::max<std::int64_t>(peers, 1) / static_cast<std::int64_t>(element));
    // Segments up to two chunks go in one round: a second round costs more than the cache gains.
    const std::int64_t largest = *std::max_element(counts.begin(), counts.end());
    if (largest <= 2 * chunk) chunk = std::max<std::int64_t>(largest, 1);
    std::int64_t rounds = 0;
    for (std::int64_t count : counts)
      rounds = std::max(rounds, (count + chunk - 1) / chunk);
    std::byte* const staging_area =
        staging(static_cast<std::size_t>(peers * std::min(chunk, counts[me])) * element);
    std::vector<MPI_Request> sends;
    std::vector<MPI_Request> receives;
    std::vector<const std::byte*> inputs(static_cast<std::size_t>(size_));
    for (std::int64_t round = 0; round < rounds; ++round) {
      const std::int64_t begin = round * chunk;
      for (int owner = 0; owner < size_; ++owner) {
        const auto i = static_cast<std::size_t>(owner);
        if (i == me || begin >= counts[i]) continue;
        sends.emplace_back();
        check_mpi(MPI_Isend(input + static_cast<std::size_t>(offsets[i] + begin) * element,
                            static_cast<int>(std::min(chunk, counts[i] - begin)), type, owner,
                            reduce_tag(call), comm_, &sends.back()),
                  "MPI_Isend");
      }
      if (begin >= counts[me]) continue;
      const std::int64_t n = std::min(chunk, counts[me] - begin);
      receives.clear();
      std::size_t slot = 0;
      for (int peer = 0; peer < size_; ++peer) {
        const auto j = static_cast<std::size_t>(peer);
        if (j == me) {
          inputs[j] = input + static_cast<std::size_t>(offsets[me] + begin) * element;
          continue;
        }
        std::byte* into = staging_area + slot++ * static_cast<std::size_t>(n) * element;
        inputs[j] = into;
        receives.emplace_back();
        check_mpi(MPI_Irecv(into, static_cast<int>(n), type, peer, reduce_tag(call), comm_,
                            &receives.back()),
                  "MPI_Irecv");
      }
      check_mpi(
          MPI_Waitall(static_cast<int>(receives.size()), receives.data(), MPI_STATUSES_IGNORE),
          "MPI_Waitall");
      std::byte* const out = output + static_cast<std::size_t>(begin) * element;
      reduce_elements(call, inputs, std::span<std::byte* const>(&out, 1),
                      static_cast<std::size_t>(n));
    }
    check_mpi(MPI_Waitall(static_cast<int>(sends.size()), sends.data(), MPI_STATUSES_IGNORE),
              "MPI_Waitall");
  }

  std::shared_ptr<MpiShared> shared_;
  MPI_Comm comm_;
  const bool owns_comm_;
  const std::uint64_t key_;  // the group's key, the same on every member
  int rank_ = 0;
  int size_ = 1;
  std::vector<std::int64_t> world_ranks_;
  // Scratch space of the collective in progress; grows, never shrinks, is never cleared.
  std::byte* staging(std::size_t bytes) {
    if (bytes > staging_bytes_) {
      staging_ = std::make_unique_for_overwrite<std::byte[]>(bytes);
      staging_bytes_ = bytes;
    }
    return staging_.get();
  }

  std::unique_ptr<std::byte[]> staging_;
  std::size_t staging_bytes_ = 0;
};

}  // namespace

namespace {
// Ranks that report the same processor name (the host name) share a host; null when all do.
std::shared_ptr<const Topology> detect_topology() {
  char name[MPI_MAX_PROCESSOR_NAME] = {};
  int length = 0;
  check_mpi(MPI_Get_processor_name(name, &length), "MPI_Get_processor_name");
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  std::vector<char> all(static_cast<std::size_t>(size) * MPI_MAX_PROCESSOR_NAME, '\0');
  check_mpi(MPI_Allgather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, all.data(),
                          MPI_MAX_PROCESSOR_NAME, MPI_CHAR, MPI_COMM_WORLD),
            "MPI_Allgather");
  std::vector<std::string> names;
  for (int r = 0; r < size; ++r) {
    const char* at = all.data() + static_cast<std::size_t>(r) * MPI_MAX_PROCESSOR_NAME;
    names.emplace_back(at, strnlen(at, MPI_MAX_PROCESSOR_NAME));
  }
  Topology topology = Topology::from_host_names(names);
  if (topology.single_level()) return nullptr;
  return std::make_shared<const Topology>(std::move(topology));
}

/// Ends the process when the job's start (MPI_Init_thread and the world's first collectives)
/// does not finish within the default collective timeout: a host lost while the others start
/// leaves them waiting inside MPI, where no collective's timeout applies.
class StartWatchdog {
 public:
  explicit StartWatchdog(std::chrono::milliseconds limit)
      : thread_([this, limit] {
          std::unique_lock lock(mutex_);
          if (finished_.wait_for(lock, limit, [&] { return done_; })) return;
          std::cerr << fmt::format(
                           "meshtensor: error: the MPI job did not start within {:.1f} s "
                           "(MPI_Init_thread and the world's first collectives): a host or rank "
                           "of the job is lost, stopped or unreachable (MESHTENSOR_TIMEOUT sets "
                           "how long to wait)",
                           std::chrono::duration<double>(limit).count())
                    << std::endl;
          std::_Exit(1);
        }) {}
  StartWatchdog(const StartWatchdog&) = delete;
  StartWatchdog& operator=(const StartWatchdog&) = delete;
  ~StartWatchdog() {
    {
      const std::lock_guard lock(mutex_);
      done_ = true;
    }
    finished_.notify_all();
    thread_.join();
  }

 private:
  std::mutex mutex_;
  std::condition_variable finished_;
  bool done_ = false;
  std::thread thread_;
};
}  // namespace

MpiWorld::MpiWorld(int* argc, char*** argv, MpiOptions options) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized != 0)
    throw CommError("MPI is already initialised; create one MpiWorld per process");
  const StartWatchdog watchdog(default_timeout());
  int provided = 0;
  check_mpi(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread");
  if (provided < MPI_THREAD_MULTIPLE) {
    MPI_Finalize();
    throw CommError(
        "the MPI library does not provide MPI_THREAD_MULTIPLE, which per-group queues need");
  }
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  // The backend's own copies of the world: its messages never meet the application's, and the
  // watchdogs' questions never meet the collectives'.
  MPI_Comm control = MPI_COMM_NULL;
  check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &control), "MPI_Comm_dup");
  MPI_Comm own_world = MPI_COMM_NULL;
  check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &own_world), "MPI_Comm_dup");
  shared_ = std::make_shared<detail::MpiShared>(
      options.check_collectives || check_mode_from_environment(), control);
  shared_->topology = detect_topology();
  world_ = std::make_shared<MpiCommunicator>(shared_, own_world, true, kWorldKey);
}

MpiWorld::~MpiWorld() {
  world_.reset();
  shared_->stop_watchdog();
  MPI_Comm control = shared_->control;
  MPI_Comm_free(&control);
  shared_->finalized.store(true);
  MPI_Finalize();
}

int MpiWorld::rank() const {
  return world_->rank();
}

int MpiWorld::size() const {
  return world_->size();
}

std::shared_ptr<Communicator> MpiWorld::communicator() const {
  return world_;
}

void MpiWorld::abort(const std::string& message, int status) const {
  shared_->abort(message, status);
}

int run_mpi(int* argc, char*** argv, const std::function<void(Communicator&)>& body,
            MpiOptions options) {
  const MpiWorld world(argc, argv, options);
  try {
    body(*world.communicator());
  } catch (const std::exception& error) {
    world.abort(fmt::format("world rank {} failed: {}", world.rank(), error.what()));
  }
  return 0;
}

}  // namespace meshtensor::comm
