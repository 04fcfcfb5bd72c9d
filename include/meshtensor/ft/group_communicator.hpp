#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include <meshtensor/comm/queued_communicator.hpp>
#include <meshtensor/ft/group_context.hpp>

namespace meshtensor::ft {

/// The replicate dimension across replica groups as a comm::Communicator: every collective of
/// the project (ordered and exact reductions included) over a quorum's GroupContext. Reductions
/// follow the backends' one pattern: each member receives every member's copy of its balanced
/// share (an all-to-all), combines them with comm::reduce_elements in member order, and the
/// shares are all-gathered; so an ordered or exact result has the bits the threads and mpi
/// backends give, for the same inputs in the same member order. A collective that loses a member
/// throws CommError (the group asks for a new quorum), or, recording failures, is recorded and
/// every later collective returns at once with its output unspecified: the callers' own control
/// flow (a training step on the group's other ranks) goes on the same, and the caller looks at
/// failure() where it can abandon the work. Splits are refused by name.
class GroupCommunicator : public comm::QueuedCommunicator {
 public:
  /// What a collective that fails does.
  enum class OnFailure : std::uint8_t { throw_error, record };
  /// Serves `context`'s members; it must outlive the communicator. Each collective waits at
  /// most the context's timeout.
  explicit GroupCommunicator(GroupContext& context, OnFailure on_failure = OnFailure::throw_error);
  ~GroupCommunicator() override;

  int rank() const override { return context_.rank(); }
  int size() const override { return context_.size(); }
  /// The members' group indices.
  const std::vector<std::int64_t>& world_ranks() const override { return members_; }
  std::string_view backend() const override { return "gloo"; }
  /// The first failure recorded (OnFailure::record), "" while there is none.
  std::string failure() const;

 protected:
  void run_collective(const comm::CollectiveCall& call, const Tensor& input, Tensor output,
                      Deadline deadline) override;
  std::shared_ptr<comm::Communicator> run_split(const comm::CollectiveCall& call,
                                                std::int64_t color, std::int64_t key,
                                                Deadline deadline) override;

 private:
  /// Every member's share of `input` (counts[r] elements for member r, in member order) combined
  /// as `call` says into `output` (counts[rank] elements).
  void reduce_to_owner(const comm::CollectiveCall& call, const std::byte* input,
                       const std::vector<std::int64_t>& counts, std::byte* output);

  void run_guarded(const comm::CollectiveCall& call, const Tensor& input, Tensor output);
  /// An all-reduce of call.count elements at `data`, in place.
  void all_reduce_piece(const comm::CollectiveCall& call, std::byte* data);
  GroupContext& context_;
  std::vector<std::int64_t> members_;
  OnFailure on_failure_;
  double timeout_;
  mutable std::mutex failure_mutex_;
  std::string failure_;
};

}  // namespace meshtensor::ft
