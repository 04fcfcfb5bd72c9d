#include <algorithm>
#include <chrono>
#include <span>

#include <fmt/format.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/ft/group_communicator.hpp>
#include <meshtensor/kernels/elementwise.hpp>

namespace meshtensor::ft {

namespace {

/// The most bytes one all-reduce piece carries.
constexpr std::int64_t kPieceBytes = std::int64_t{32} << 20;

std::vector<std::int64_t> in_bytes(std::vector<std::int64_t> counts, std::size_t element) {
  for (std::int64_t& c : counts)
    c *= static_cast<std::int64_t>(element);
  return counts;
}

std::span<const char> chars(const std::byte* data, std::int64_t bytes) {
  return {reinterpret_cast<const char*>(data), static_cast<std::size_t>(bytes)};
}

std::span<char> chars(std::byte* data, std::int64_t bytes) {
  return {reinterpret_cast<char*>(data), static_cast<std::size_t>(bytes)};
}

std::int64_t total(const std::vector<std::int64_t>& counts) {
  std::int64_t sum = 0;
  for (const std::int64_t c : counts)
    sum += c;
  return sum;
}

}  // namespace

GroupCommunicator::GroupCommunicator(GroupContext& context, OnFailure on_failure)
    : context_(context),
      members_(context.quorum().members),
      on_failure_(on_failure),
      timeout_(context.timeout()) {}

std::string GroupCommunicator::failure() const {
  const std::lock_guard lock(failure_mutex_);
  return failure_;
}

GroupCommunicator::~GroupCommunicator() {
  stop_queue();
}

void GroupCommunicator::reduce_to_owner(const comm::CollectiveCall& call, const std::byte* input,
                                        const std::vector<std::int64_t>& counts,
                                        std::byte* output) {
  const std::size_t element = dtype_size(call.dtype);
  const int members = size();
  const std::int64_t mine = counts[static_cast<std::size_t>(rank())];
  // Every member's copy of this member's share, in member order.
  std::vector<std::byte> copies(static_cast<std::size_t>(mine * members) * element);
  context_.all_to_all_bytes(chars(input, total(counts) * static_cast<std::int64_t>(element)),
                            in_bytes(counts, element),
                            chars(copies.data(), static_cast<std::int64_t>(copies.size())),
                            std::vector<std::int64_t>(static_cast<std::size_t>(members),
                                                      mine * static_cast<std::int64_t>(element)));
  std::vector<const std::byte*> inputs;
  for (int r = 0; r < members; ++r)
    inputs.push_back(copies.data() + static_cast<std::size_t>(r * mine) * element);
  std::byte* outputs[] = {output};
  comm::reduce_elements(call, inputs, outputs, static_cast<std::size_t>(mine));
}

void GroupCommunicator::run_collective(const comm::CollectiveCall& call, const Tensor& input,
                                       Tensor output, Deadline deadline) {
  const double left =
      std::chrono::duration<double>(deadline - std::chrono::steady_clock::now()).count();
  context_.set_timeout(std::max(0.001, std::min(left, timeout_)));
  if (on_failure_ == OnFailure::throw_error) {
    run_guarded(call, input, std::move(output));
    return;
  }
  if (!failure().empty()) return;
  try {
    run_guarded(call, input, std::move(output));
  } catch (const CommError& e) {
    const std::lock_guard lock(failure_mutex_);
    failure_ = e.what();
  }
}

void GroupCommunicator::all_reduce_piece(const comm::CollectiveCall& call, std::byte* data) {
  const std::size_t element = dtype_size(call.dtype);
  const std::vector<std::int64_t> counts = comm::balanced_counts(call.count, size());
  const std::int64_t mine = counts[static_cast<std::size_t>(rank())];
  std::vector<std::byte> reduced(static_cast<std::size_t>(mine) * element);
  reduce_to_owner(call, data, counts, reduced.data());
  context_.all_gather_bytes(chars(reduced.data(), static_cast<std::int64_t>(reduced.size())),
                            chars(data, call.count * static_cast<std::int64_t>(element)),
                            in_bytes(counts, element));
}

void GroupCommunicator::run_guarded(const comm::CollectiveCall& call, const Tensor& input,
                                    Tensor output) {
  const std::size_t element = dtype_size(call.dtype);
  switch (call.kind) {
    case comm::CollectiveKind::all_reduce: {
      // In pieces, each within the timeout: a large gradient takes many, a silent peer is still
      // found within one timeout (elementwise: the bits do not depend on the pieces).
      const std::int64_t piece =
          std::max<std::int64_t>(1, kPieceBytes / static_cast<std::int64_t>(element));
      comm::CollectiveCall part = call;
      for (std::int64_t first = 0; first < call.count; first += piece) {
        part.count = std::min(piece, call.count - first);
        all_reduce_piece(part, output.bytes().data() + first * static_cast<std::int64_t>(element));
      }
      break;
    }
    case comm::CollectiveKind::reduce_scatter:
      reduce_to_owner(call, input.bytes().data(), call.segment_counts, output.bytes().data());
      break;
    case comm::CollectiveKind::all_gather: {
      const std::int64_t mine = call.segment_counts[static_cast<std::size_t>(rank())];
      // The input may be the output's own segment: gather from a copy.
      const std::vector<std::byte> own(input.bytes().begin(),
                                       input.bytes().begin() + mine * element);
      context_.all_gather_bytes(chars(own.data(), mine * element),
                                chars(output.bytes().data(), total(call.segment_counts) * element),
                                in_bytes(call.segment_counts, element));
      break;
    }
    case comm::CollectiveKind::all_to_all:
      context_.all_to_all_bytes(chars(input.bytes().data(), total(call.send_counts) * element),
                                in_bytes(call.send_counts, element),
                                chars(output.bytes().data(), total(call.recv_counts) * element),
                                in_bytes(call.recv_counts, element));
      break;
    case comm::CollectiveKind::broadcast:
      context_.broadcast(chars(output.bytes().data(), call.count * element), call.root);
      break;
    case comm::CollectiveKind::barrier:
      context_.barrier();
      break;
    case comm::CollectiveKind::split:
      break;
  }
}

std::shared_ptr<comm::Communicator> GroupCommunicator::run_split(const comm::CollectiveCall&,
                                                                 std::int64_t, std::int64_t,
                                                                 Deadline) {
  throw InvalidArgument(
      "the replica groups' communicator does not split: the replicate dimension across groups "
      "is one-dimensional");
}

}  // namespace meshtensor::ft
