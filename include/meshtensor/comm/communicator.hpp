#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <meshtensor/comm/work.hpp>
#include <meshtensor/core/reduce_op.hpp>
#include <meshtensor/core/tensor.hpp>
#include <meshtensor/mesh/topology.hpp>

namespace meshtensor::comm {

/// How a reducing collective combines values (DESIGN §3.3).
enum class ReductionMode : std::uint8_t {
  native,   ///< the backend's own algorithm: fastest, no bitwise promise
  ordered,  ///< each element combined in ascending group-rank order: same bits on every rank
  exact,    ///< correctly rounded exact sum: same bits for any grouping
};

/// "native", "ordered" or "exact".
std::string_view reduction_mode_name(ReductionMode mode);
/// Parses a reduction mode name; throws ParseError naming the token.
ReductionMode parse_reduction_mode(std::string_view text);

/// Collective timeout when neither set_default_timeout() nor MESHTENSOR_TIMEOUT says otherwise.
inline constexpr std::chrono::milliseconds kDefaultTimeout{std::chrono::minutes(5)};

/// The timeout of calls that do not set one: set_default_timeout()'s value, else the environment
/// variable MESHTENSOR_TIMEOUT (seconds, e.g. "30" or "2.5"), else kDefaultTimeout.
std::chrono::milliseconds default_timeout();

/// Sets default_timeout() for the whole process; throws InvalidArgument unless positive.
void set_default_timeout(std::chrono::milliseconds timeout);

/// True when MESHTENSOR_CHECK_COLLECTIVES=1 (check mode): backends compare every call across
/// ranks and the FSDP runtime compares its issue order every step.
bool check_mode_from_environment();

/// Parses a timeout in seconds ("30", "2.5"): positive and at most a week; throws ParseError
/// naming `what` and the text otherwise.
std::chrono::milliseconds parse_timeout_seconds(std::string_view text, std::string_view what);

/// A timeout that never expires (e.g. Python's `timeout=math.inf`).
inline constexpr std::chrono::milliseconds kNoTimeout = std::chrono::milliseconds::max();

/// Now plus `timeout`, saturating at the clock's last point, so kNoTimeout never expires.
std::chrono::steady_clock::time_point deadline_after(std::chrono::milliseconds timeout);

/// A timeout given in seconds by a program: positive; +infinity means kNoTimeout. Throws
/// InvalidArgument naming `what` and the value otherwise (zero, negative, NaN).
std::chrono::milliseconds timeout_from_seconds(double seconds, std::string_view what);

/// Per-call options.
struct CollectiveOptions {
  ReduceOp op = ReduceOp::sum;                            ///< reducing collectives only
  ReductionMode mode = ReductionMode::ordered;            ///< reducing collectives only
  std::chrono::milliseconds timeout = default_timeout();  ///< how long to wait for the others
  /// What the call is for, e.g. "unshard layers.0": part of the call that every rank must agree
  /// on (a rank that issues another label at this position is a DesyncError naming both) and of
  /// every message about it. Empty: unlabelled.
  std::string label = {};
};

/// The collectives a Communicator offers.
enum class CollectiveKind : std::uint8_t {
  all_reduce,
  reduce_scatter,
  all_gather,
  all_to_all,
  broadcast,
  barrier,
  split
};

/// "all_reduce", ...
std::string_view collective_name(CollectiveKind kind);

/// What one rank asked for, in normalised form: the fingerprint compared across ranks and the
/// per-rank element counts the data movement follows.
struct CollectiveCall {
  CollectiveKind kind = CollectiveKind::barrier;
  std::int64_t sequence = 0;  ///< position in this rank's issue order on the group
  DType dtype = DType::u8;
  ReduceOp op = ReduceOp::sum;
  ReductionMode mode = ReductionMode::ordered;
  int root = -1;                             ///< broadcast only
  std::int64_t count = 0;                    ///< all_reduce / broadcast: elements per rank
  std::vector<std::int64_t> segment_counts;  ///< reduce_scatter / all_gather: elements per rank
  std::vector<std::int64_t> send_counts;     ///< all_to_all: elements this rank sends to each rank
  std::vector<std::int64_t> recv_counts;     ///< all_to_all: elements it receives from each rank
  std::string label;                         ///< CollectiveOptions::label

  /// "all_reduce #3 (f32, 1024 elements, sum, ordered)".
  std::string to_string() const;
  /// to_string() without what legitimately differs from rank to rank (all_to_all counts): equal
  /// on every rank that issued this call.
  std::string match_key() const;
};

/// True when `call` is a reduction that `exact` mode computes in fixed point: sum or avg of a
/// floating dtype. Every other exact reduction (max, min, integer sums) is already exact and
/// order-free, and runs as `ordered`.
bool uses_fixed_point(const CollectiveCall& call);

/// Throws InvalidArgument when an exact fixed-point reduction would have more than
/// kernels::kMaxExactAddends addends per element (the limbs' headroom).
void check_exact_addends(const CollectiveCall& call, std::int64_t addends);

/// Checks that the calls every rank of a group made at one sequence position fit together.
/// Throws DesyncError naming both sides of the first disagreement (group positions and world
/// ranks) when they do not. Pure: every rank reaches the same verdict.
void check_calls_match(std::span<const CollectiveCall* const> calls,
                       const std::vector<std::int64_t>& world_ranks);

/// A group of ranks that run collectives together. Every call is collective: all members issue
/// the same calls in the same order. Async calls queue on the group's own FIFO queue and return
/// a Work handle; the blocking forms wait on it. Buffers are contiguous tensors of one dtype,
/// counts are in elements, and tensors must stay untouched until the work completes.
class Communicator {
 public:
  virtual ~Communicator() = default;

  /// This rank's position in the group.
  virtual int rank() const = 0;
  /// Number of ranks in the group.
  virtual int size() const = 0;
  /// Members' ranks in the world, in group order.
  virtual const std::vector<std::int64_t>& world_ranks() const = 0;
  /// "threads" or "mpi".
  virtual std::string_view backend() const = 0;
  /// Throws CommError with the cause when the job this rank belongs to was aborted (another
  /// rank failed, the run was interrupted): long work between collectives calls it so that an
  /// interrupt stops it at once. Does nothing where aborts end the process (mpi).
  virtual void throw_if_aborted() const {}
  /// Where the job's ranks sit, indexed by world rank: given to a threads world, detected from
  /// host names on mpi. Null: every rank on one host.
  virtual std::shared_ptr<const Topology> topology() const { return nullptr; }

  /// buffer = op over every rank's buffer (in place).
  virtual Work all_reduce_async(Tensor buffer, const CollectiveOptions& options) = 0;
  /// output = op over every rank's segment `rank()` of input; input holds sum(counts) elements
  /// split into consecutive segments of counts[i], output holds counts[rank()]. Empty counts:
  /// equal segments.
  virtual Work reduce_scatter_async(Tensor input, Tensor output, std::vector<std::int64_t> counts,
                                    const CollectiveOptions& options) = 0;
  /// output = every rank's input back to back; rank i contributes counts[i] elements. Empty
  /// counts: equal contributions.
  virtual Work all_gather_async(Tensor input, Tensor output, std::vector<std::int64_t> counts,
                                const CollectiveOptions& options) = 0;
  /// Segment i of input (send_counts[i] elements) goes to rank i; segment i of output
  /// (recv_counts[i] elements) comes from rank i. Empty counts: equal segments.
  virtual Work all_to_all_async(Tensor input, Tensor output, std::vector<std::int64_t> send_counts,
                                std::vector<std::int64_t> recv_counts,
                                const CollectiveOptions& options) = 0;
  /// buffer = root's buffer.
  virtual Work broadcast_async(Tensor buffer, int root, const CollectiveOptions& options) = 0;
  /// Completes once every rank issued it.
  virtual Work barrier_async(const CollectiveOptions& options) = 0;
  /// Collective: members passing the same color >= 0 form a new group ordered by (key, rank);
  /// a negative color returns null. Runs in order with the group's queued work.
  virtual std::shared_ptr<Communicator> split(std::int64_t color, std::int64_t key,
                                              const CollectiveOptions& options) = 0;

  // The blocking forms: by default the async call and a wait; a backend may run them more
  // directly (the queued backends run them on the calling thread when the group's queue is idle).

  /// Blocking all_reduce.
  virtual void all_reduce(const Tensor& buffer, const CollectiveOptions& options = {});
  /// Blocking reduce_scatter.
  virtual void reduce_scatter(const Tensor& input, const Tensor& output,
                              std::vector<std::int64_t> counts = {},
                              const CollectiveOptions& options = {});
  /// Blocking all_gather.
  virtual void all_gather(const Tensor& input, const Tensor& output,
                          std::vector<std::int64_t> counts = {},
                          const CollectiveOptions& options = {});
  /// Blocking all_to_all.
  virtual void all_to_all(const Tensor& input, const Tensor& output,
                          std::vector<std::int64_t> send_counts = {},
                          std::vector<std::int64_t> recv_counts = {},
                          const CollectiveOptions& options = {});
  /// Blocking broadcast.
  virtual void broadcast(const Tensor& buffer, int root, const CollectiveOptions& options = {});
  /// Blocking barrier.
  virtual void barrier(const CollectiveOptions& options = {});
};

/// Validates arguments on the calling rank and returns the normalised call (sequence unset).
/// Throws InvalidArgument naming the bad value (non-contiguous or undefined tensor, dtype
/// mismatch, wrong number of counts, negative counts, sizes that do not add up, bad root).
CollectiveCall describe_all_reduce(const Tensor& buffer, const CollectiveOptions& options,
                                   int size);
/// See describe_all_reduce.
CollectiveCall describe_reduce_scatter(const Tensor& input, const Tensor& output,
                                       std::vector<std::int64_t> counts,
                                       const CollectiveOptions& options, int rank, int size);
/// See describe_all_reduce.
CollectiveCall describe_all_gather(const Tensor& input, const Tensor& output,
                                   std::vector<std::int64_t> counts, int rank, int size);
/// See describe_all_reduce.
CollectiveCall describe_all_to_all(const Tensor& input, const Tensor& output,
                                   std::vector<std::int64_t> send_counts,
                                   std::vector<std::int64_t> recv_counts, int size);
/// See describe_all_reduce.
CollectiveCall describe_broadcast(const Tensor& buffer, int root, int size);

/// `count` elements split over `size` ranks as evenly as possible, the first count % size ranks
/// taking one more (the split all_reduce uses to share its work).
std::vector<std::int64_t> balanced_counts(std::int64_t count, int size);

/// Prefix sums: displacements[i] = counts[0] + ... + counts[i-1].
std::vector<std::int64_t> displacements(const std::vector<std::int64_t>& counts);

}  // namespace meshtensor::comm
