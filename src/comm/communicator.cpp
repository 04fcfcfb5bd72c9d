#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <numeric>

#include <fmt/format.h>

#include <meshtensor/comm/communicator.hpp>
#include <meshtensor/core/enum_names.hpp>
#include <meshtensor/core/error.hpp>
#include <meshtensor/kernels/fixed_point.hpp>

namespace meshtensor::comm {

namespace {
constexpr EnumName<ReductionMode> kReductionModeNames[] = {{ReductionMode::native, "native"},
                                                           {ReductionMode::ordered, "ordered"},
                                                           {ReductionMode::exact, "exact"}};
constexpr EnumName<CollectiveKind> kCollectiveNames[] = {
    {CollectiveKind::all_reduce, "all_reduce"},
    {CollectiveKind::reduce_scatter, "reduce_scatter"},
    {CollectiveKind::all_gather, "all_gather"},
    {CollectiveKind::all_to_all, "all_to_all"},
    {CollectiveKind::broadcast, "broadcast"},
    {CollectiveKind::barrier, "barrier"},
    {CollectiveKind::split, "split"}};
}  // namespace

std::string_view reduction_mode_name(ReductionMode mode) {
  return enum_name(kReductionModeNames, mode, "reduction mode");
}

ReductionMode parse_reduction_mode(std::string_view text) {
  return parse_enum(kReductionModeNames, text, "reduction mode");
}

namespace {
std::atomic<std::int64_t> default_timeout_ms{-1};  // -1: not set, read the environment

std::chrono::milliseconds timeout_from_environment() {
  const char* text = std::getenv("MESHTENSOR_TIMEOUT");
  if (text == nullptr || *text == '\0') return kDefaultTimeout;
  return parse_timeout_seconds(text, "MESHTENSOR_TIMEOUT");
}
}  // namespace

std::chrono::milliseconds default_timeout() {
  const std::int64_t set = default_timeout_ms.load(std::memory_order_relaxed);
  if (set >= 0) return std::chrono::milliseconds(set);
  static const std::chrono::milliseconds from_environment = timeout_from_environment();
  return from_environment;
}

void set_default_timeout(std::chrono::milliseconds timeout) {
  if (timeout.count() <= 0) {
    throw InvalidArgument(fmt::format("a timeout must be positive, not {} ms", timeout.count()));
  }
  default_timeout_ms.store(timeout.count(), std::memory_order_relaxed);
}

bool check_mode_from_environment() {
  const char* value = std::getenv("MESHTENSOR_CHECK_COLLECTIVES");
  return value != nullptr && std::string_view(value) == "1";
}

std::chrono::milliseconds parse_timeout_seconds(std::string_view text, std::string_view what) {
  constexpr double kWeek = 7 * 24 * 3600.0;
  const std::string copy(text);
  char* end = nullptr;
  errno = 0;
  const double seconds = copy.empty() || copy.front() == ' ' ? 0 : std::strtod(copy.c_str(), &end);
  const bool parsed = !copy.empty() && end == copy.c_str() + copy.size() && errno == 0;
  if (!parsed || !(seconds > 0) || seconds > kWeek) {
    throw ParseError(fmt::format(
        "{} '{}' is not a timeout: expected seconds, more than 0 and at most {} (a week)", what,
        text, kWeek));
  }
  return std::chrono::milliseconds(std::max<std::int64_t>(1, std::llround(seconds * 1000)));
}

std::chrono::steady_clock::time_point deadline_after(std::chrono::milliseconds timeout) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point now = Clock::now();
  const auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(Clock::time_point::max() - now);
  if (timeout >= left) return Clock::time_point::max();
  return now + timeout;
}

std::chrono::milliseconds timeout_from_seconds(double seconds, std::string_view what) {
  if (!(seconds > 0)) {
    throw InvalidArgument(fmt::format(
        "{} must be a positive number of seconds (or inf for none), got {}", what, seconds));
  }
  // Beyond what milliseconds hold, and +inf: no limit.
  if (seconds >= static_cast<double>(kNoTimeout.count()) / 1000) return kNoTimeout;
  return std::chrono::milliseconds(std::max<std::int64_t>(1, std::llround(seconds * 1000)));
}

std::string_view collective_name(CollectiveKind kind) {
  return enum_name(kCollectiveNames, kind, "collective kind");
}

namespace {
bool is_reducing(CollectiveKind kind) {
  return kind == CollectiveKind::all_reduce || kind == CollectiveKind::reduce_scatter;
}
}  // namespace

std::string CollectiveCall::to_string() const {
  std::string details;
  switch (kind) {
    case CollectiveKind::all_reduce:
    case CollectiveKind::broadcast:
      details = fmt::format("{}, {} elements", dtype_name(dtype), count);
      break;
    case CollectiveKind::reduce_scatter:
    case CollectiveKind::all_gather:
      details = fmt::format("{}, counts [{}]", dtype_name(dtype), fmt::join(segment_counts, ","));
      break;
    case CollectiveKind::all_to_all:
      details = fmt::format("{}, send [{}], recv [{}]", dtype_name(dtype),
                            fmt::join(send_counts, ","), fmt::join(recv_counts, ","));
      break;
    case CollectiveKind::barrier:
    case CollectiveKind::split:
      break;
  }
  if (is_reducing(kind))
    details += fmt::format(", {}, {}", reduce_op_name(op), reduction_mode_name(mode));
  if (kind == CollectiveKind::broadcast) details += fmt::format(", root {}", root);
  if (!label.empty())
    details = fmt::format("'{}'{}{}", label, details.empty() ? "" : ", ", details);
  return fmt::format("{} #{}{}", collective_name(kind), sequence,
                     details.empty() ? "" : " (" + details + ")");
}

std::string CollectiveCall::match_key() const {
  if (kind != CollectiveKind::all_to_all) return to_string();
  CollectiveCall shared = *this;
  shared.send_counts.clear();
  shared.recv_counts.clear();
  return shared.to_string();
}

void check_calls_match(std::span<const CollectiveCall* const> calls,
                       const std::vector<std::int64_t>& world_ranks) {
  const auto side = [&](std::size_t i) {
    return fmt::format("group rank {} (world rank {}) issued {}", i, world_ranks[i],
                       calls[i]->to_string());
  };
  const CollectiveCall& first = *calls[0];
  for (std::size_t i = 1; i < calls.size(); ++i) {
    const CollectiveCall& call = *calls[i];
    bool same =
        call.kind == first.kind && call.sequence == first.sequence && call.label == first.label;
    if (same && call.kind != CollectiveKind::barrier && call.kind != CollectiveKind::split) {
      same = call.dtype == first.dtype;
    }
    if (same && is_reducing(call.kind)) same = call.op == first.op && call.mode == first.mode;
    if (same &&
        (call.kind == CollectiveKind::all_reduce || call.kind == CollectiveKind::broadcast)) {
      same = call.count == first.count && call.root == first.root;
    }
    if (same &&
        (call.kind == CollectiveKind::reduce_scatter || call.kind == CollectiveKind::all_gather)) {
      same = call.segment_counts == first.segment_counts;
    }
    if (!same)
      throw DesyncError(fmt::format("collectives do not match: {}, but {}", side(0), side(i)));
  }
  if (first.kind != CollectiveKind::all_to_all) return;
  for (std::size_t sender = 0; sender < calls.size(); ++sender) {
    for (std::size_t receiver = 0; receiver < calls.size(); ++receiver) {
      if (calls[sender]->send_counts[receiver] != calls[receiver]->recv_counts[sender]) {
        throw DesyncError(
            fmt::format("all_to_all counts do not match: {} sends {} elements to group rank {}, "
                        "but {} expects {}",
                        side(sender), calls[sender]->send_counts[receiver], receiver,
                        side(receiver), calls[receiver]->recv_counts[sender]));
      }
    }
  }
}

bool uses_fixed_point(const CollectiveCall& call) {
  return (call.kind == CollectiveKind::all_reduce || call.kind == CollectiveKind::reduce_scatter) &&
         is_floating(call.dtype) && (call.op == ReduceOp::sum || call.op == ReduceOp::avg);
}

void check_exact_addends(const CollectiveCall& call, std::int64_t addends) {
  if (call.mode == ReductionMode::exact && uses_fixed_point(call) &&
      addends > kernels::kMaxExactAddends) {
    throw InvalidArgument(fmt::format(
        "{}: an exact reduction over {} ranks exceeds the limit of {} addends per element",
        collective_name(call.kind), addends, kernels::kMaxExactAddends));
  }
}

std::vector<std::int64_t> balanced_counts(std::int64_t count, int size) {
  std::vector<std::int64_t> counts(static_cast<std::size_t>(size), count / size);
  for (std::int64_t i = 0; i < count % size; ++i)
    ++counts[static_cast<std::size_t>(i)];
  return counts;
}

std::vector<std::int64_t> displacements(const std::vector<std::int64_t>& counts) {
  std::vector<std::int64_t> result(counts.size(), 0);
  for (std::size_t i = 1; i < counts.size(); ++i)
    result[i] = result[i - 1] + counts[i - 1];
  return result;
}

namespace {
void check_buffer(const Tensor& tensor, std::string_view role, CollectiveKind kind) {
  if (!tensor.defined()) {
    throw InvalidArgument(
        fmt::format("{}: the {} tensor is undefined", collective_name(kind), role));
  }
  if (!tensor.is_contiguous()) {
    throw InvalidArgument(
        fmt::format("{}: the {} tensor ({}) is a strided view; pass a contiguous tensor",
                    collective_name(kind), role, tensor.shape().to_string()));
  }
}

// The checks every collective with an input and an output makes; the call of that kind and dtype.
CollectiveCall describe_input_output(const Tensor& input, const Tensor& output,
                                     CollectiveKind kind) {
  check_buffer(input, "input", kind);
  check_buffer(output, "output", kind);
  if (input.dtype() != output.dtype()) {
    throw InvalidArgument(fmt::format("{}: input is {} but output is {}", collective_name(kind),
                                      dtype_name(input.dtype()), dtype_name(output.dtype())));
  }
  CollectiveCall call;
  call.kind = kind;
  call.dtype = input.dtype();
  return call;
}

// Counts given by the caller, or `total` split equally; checked against the group size and total.
std::vector<std::int64_t> resolve_counts(std::vector<std::int64_t> counts, std::int64_t total,
                                         int size, std::string_view what, CollectiveKind kind) {
  if (counts.empty()) {
    if (total % size != 0) {
      throw InvalidArgument(
          fmt::format("{}: {} of {} elements does not split evenly over {} ranks; pass "
                      "per-rank counts",
                      collective_name(kind), what, total, size));
    }
    return std::vector<std::int64_t>(static_cast<std::size_t>(size), total / size);
  }
  if (counts.size() != static_cast<std::size_t>(size)) {
    throw InvalidArgument(fmt::format("{}: {} counts [{}] for a group of {} ranks",
                                      collective_name(kind), counts.size(), list_excerpt(counts),
                                      size));
  }
  for (std::int64_t c : counts) {
    if (c < 0) {
      throw InvalidArgument(fmt::format("{}: count {} in [{}] is negative", collective_name(kind),
                                        c, list_excerpt(counts)));
    }
  }
  std::int64_t sum = 0;
  for (const std::int64_t c : counts) {
    if (__builtin_add_overflow(sum, c, &sum)) {
      throw InvalidArgument(fmt::format("{}: counts [{}] add up to more than 2^63 - 1 elements",
                                        collective_name(kind), list_excerpt(counts)));
    }
  }
  if (sum != total) {
    throw InvalidArgument(fmt::format("{}: counts [{}] add up to {}, but the {} holds {} elements",
                                      collective_name(kind), list_excerpt(counts), sum, what,
                                      total));
  }
  return counts;
}

void expect_count(std::int64_t actual, std::int64_t expected, std::string_view what,
                  CollectiveKind kind) {
  if (actual != expected) {
    throw InvalidArgument(fmt::format("{}: the {} holds {} elements, the counts say {}",
                                      collective_name(kind), what, actual, expected));
  }
}
}  // namespace

CollectiveCall describe_all_reduce(const Tensor& buffer, const CollectiveOptions& options, int) {
  check_buffer(buffer, "buffer", CollectiveKind::all_reduce);
  CollectiveCall call;
  call.kind = CollectiveKind::all_reduce;
  call.dtype = buffer.dtype();
  call.op = options.op;
  call.mode = options.mode;
  call.count = buffer.numel();
  return call;
}

CollectiveCall describe_reduce_scatter(const Tensor& input, const Tensor& output,
                                       std::vector<std::int64_t> counts,
                                       const CollectiveOptions& options, int rank, int size) {
  constexpr auto kKind = CollectiveKind::reduce_scatter;
  CollectiveCall call = describe_input_output(input, output, kKind);
  call.op = options.op;
  call.mode = options.mode;
  call.segment_counts = resolve_counts(std::move(counts), input.numel(), size, "input", kKind);
  expect_count(output.numel(), call.segment_counts[static_cast<std::size_t>(rank)], "output",
               kKind);
  return call;
}

CollectiveCall describe_all_gather(const Tensor& input, const Tensor& output,
                                   std::vector<std::int64_t> counts, int rank, int size) {
  constexpr auto kKind = CollectiveKind::all_gather;
  CollectiveCall call = describe_input_output(input, output, kKind);
  call.segment_counts = resolve_counts(std::move(counts), output.numel(), size, "output", kKind);
  expect_count(input.numel(), call.segment_counts[static_cast<std::size_t>(rank)], "input", kKind);
  return call;
}

CollectiveCall describe_all_to_all(const Tensor& input, const Tensor& output,
                                   std::vector<std::int64_t> send_counts,
                                   std::vector<std::int64_t> recv_counts, int size) {
  constexpr auto kKind = CollectiveKind::all_to_all;
  CollectiveCall call = describe_input_output(input, output, kKind);
  if (send_counts.empty() != recv_counts.empty()) {
    throw InvalidArgument("all_to_all: pass both send and receive counts, or neither");
  }
  call.send_counts = resolve_counts(std::move(send_counts), input.numel(), size, "input", kKind);
  call.recv_counts = resolve_counts(std::move(recv_counts), output.numel(), size, "output", kKind);
  return call;
}

CollectiveCall describe_broadcast(const Tensor& buffer, int root, int size) {
  check_buffer(buffer, "buffer", CollectiveKind::broadcast);
  if (root < 0 || root >= size) {
    throw InvalidArgument(
        fmt::format("broadcast: root {} is not a rank of this group of {}", root, size));
  }
  CollectiveCall call;
  call.kind = CollectiveKind::broadcast;
  call.dtype = buffer.dtype();
  call.count = buffer.numel();
  call.root = root;
  return call;
}

void Communicator::all_reduce(const Tensor& buffer, const CollectiveOptions& options) {
  all_reduce_async(buffer, options).wait();
}

void Communicator::reduce_scatter(const Tensor& input, const Tensor& output,
                                  std::vector<std::int64_t> counts,
                                  const CollectiveOptions& options) {
  reduce_scatter_async(input, output, std::move(counts), options).wait();
}

void Communicator::all_gather(const Tensor& input, const Tensor& output,
                              std::vector<std::int64_t> counts, const CollectiveOptions& options) {
  all_gather_async(input, output, std::move(counts), options).wait();
}

void Communicator::all_to_all(const Tensor& input, const Tensor& output,
                              std::vector<std::int64_t> send_counts,
                              std::vector<std::int64_t> recv_counts,
                              const CollectiveOptions& options) {
  all_to_all_async(input, output, std::move(send_counts), std::move(recv_counts), options).wait();
}

void Communicator::broadcast(const Tensor& buffer, int root, const CollectiveOptions& options) {
  broadcast_async(buffer, root, options).wait();
}

void Communicator::barrier(const CollectiveOptions& options) {
  barrier_async(options).wait();
}

}  // namespace meshtensor::comm
