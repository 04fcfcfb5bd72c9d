#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <meshtensor/comm/communicator.hpp>

namespace meshtensor::train {

/// The replicate dimension across jobs of a fault-tolerant run, as the trainer takes it each
/// step (ft::ReplicaGroups implements it over a coordinator and Gloo): which replica groups take
/// the step, this rank's communicator with the ranks of the same place in the other groups, and
/// the broadcast a group that is behind heals by. Every method is collective over the group's
/// own ranks (train()'s world), called by each of them in the same order.
class ReplicaLink {
 public:
  virtual ~ReplicaLink() = default;

  /// A step's quorum as this group takes it.
  struct StepQuorum {
    std::int64_t step = 0;  ///< the step the members take (ahead of this group's: it heals)
    int member = 0;         ///< this group's place among the members (ascending group order)
    int members = 1;        ///< groups taking the step: they split its global batch
    /// The member whose state the members behind the step receive (heal_state()), if any is.
    std::optional<int> heal_root;
    /// This rank's communicator with the same rank of every member (nullptr when this group is
    /// alone): the FSDP replicate group of the step.
    std::shared_ptr<comm::Communicator> replicate;
  };

  /// The quorum of `step`, this group's last finished step plus one; `fresh`: this group's
  /// cross-group work failed since the last call, so the data plane must be built anew.
  /// nullopt when the members did not all meet: ask again with `fresh`.
  virtual std::optional<StepQuorum> begin_step(std::int64_t step, bool fresh) = 0;
  /// Replaces `bytes` with those of member `root` (the same length on every member), over this
  /// rank's link; false when the link failed.
  virtual bool broadcast(std::span<char> bytes, int root) = 0;
  /// Whether this rank's cross-group work failed since begin_step() (this rank's view only).
  virtual bool failed() = 0;
  /// Things the run should tell the user (a coordinator unreachable while the quorum went on),
  /// taken once.
  virtual std::vector<std::string> take_notes() { return {}; }
};

}  // namespace meshtensor::train
