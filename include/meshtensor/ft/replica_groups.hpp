#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <meshtensor/comm/communicator.hpp>
#include <meshtensor/ft/coordinator.hpp>
#include <meshtensor/train/replica_link.hpp>
#include <meshtensor/train/trainer.hpp>

namespace meshtensor::ft {

/// Where a job stands in a fault-tolerant run (`train --replica-groups N --replica-group I
/// --coordinator HOST:PORT`).
struct ReplicaGroupsConfig {
  std::int64_t groups = 0;      ///< replica groups of the run (0: not a fault-tolerant run)
  std::int64_t group = 0;       ///< this job's group, 0 .. groups - 1
  std::string coordinator;      ///< the coordinator's "HOST:PORT"
  std::int64_t min_groups = 1;  ///< the fewest groups a step may run with
  /// Seconds every cross-group operation waits at most: a silent group is given up after it.
  double timeout = 10.0;
  /// The address the other groups reach this one at ("": the one this process reaches the
  /// coordinator from).
  std::string host;
  /// Seconds a group waits at most for an unreachable coordinator when it cannot go on without
  /// one (its data plane failed); a quorum that the coordinator has not formed yet is waited
  /// for as long as the coordinator answers.
  double coordinator_timeout = 30.0;
};

/// InvalidArgument naming the value: no groups with a group or a coordinator given, a group out
/// of 0 .. groups - 1, min_groups out of 1 .. groups, timeouts that are not positive, a
/// coordinator that is not HOST:PORT.
void validate_replica_groups(const ReplicaGroupsConfig& config);

/// A fault-tolerant run's training config: with replica groups and no layout given (no strategy,
/// no mesh), a group's ranks shard (fsdp), the groups being the replicate dimension. Checks
/// `groups` first (validate_replica_groups).
train::TrainConfig replica_group_defaults(train::TrainConfig config,
                                          const ReplicaGroupsConfig& groups, bool layout_given);

/// A replica group of a fault-tolerant run, as train() takes it (train::ReplicaLink): world rank
/// 0 keeps the group's membership with the coordinator (join, heartbeats, a quorum each step)
/// and tells the group's other ranks the quorum; every rank holds a Gloo context (its "shard
/// position") with the ranks of the same world rank in the quorum's other members, rebuilt when
/// the quorum's id changes, and its collectives record failures instead of throwing, so that
/// the group's own collectives go on in step and the step is redone. While the coordinator is
/// unreachable, the groups go on in their last quorum as long as its data plane holds (a note
/// says so); a group that needs a new quorum then waits for the coordinator up to
/// coordinator_timeout.
class ReplicaGroups : public train::ReplicaLink {
 public:
  /// Collective over the group's ranks `world`: world rank 0 joins the coordinator as
  /// config.group of a run of `fingerprint` (train::run_fingerprint). Every rank throws the
  /// coordinator's refusal (DataError naming it: another model or layout, a group joined twice)
  /// or CommError naming an unreachable coordinator.
  ReplicaGroups(comm::Communicator& world, ReplicaGroupsConfig config, std::string fingerprint);
  ~ReplicaGroups() override;
  ReplicaGroups(const ReplicaGroups&) = delete;
  ReplicaGroups& operator=(const ReplicaGroups&) = delete;

  std::optional<StepQuorum> begin_step(std::int64_t step, bool fresh) override;
  bool broadcast(std::span<char> bytes, int root) override;
  bool failed() override;
  std::vector<std::string> take_notes() override;

 private:
  struct Plane;
  /// World rank 0: the quorum of `step` from the coordinator, or the last one while it is
  /// unreachable and the data plane is whole.
  Quorum ask(std::int64_t step, bool fresh);
  /// The last quorum again, at `step`, with a note that the coordinator is away.
  Quorum going_on_without_coordinator(std::int64_t step);
  /// This rank's context and communicator for `quorum`; false when its members did not meet.
  bool build_plane(const Quorum& quorum);

  comm::Communicator& world_;
  ReplicaGroupsConfig config_;
  std::string host_;
  std::unique_ptr<CoordinatorClient> client_;  // world rank 0's
  std::optional<Quorum> current_;
  std::shared_ptr<Plane> plane_;
  std::vector<std::string> notes_;
  bool coordinator_lost_ = false;
  std::chrono::steady_clock::time_point last_try_;  // of reaching the coordinator
};

/// The replica group `groups` makes `world` (collective; nullptr when groups.groups is 0), for
/// the run of `config` and `task` (its fingerprint, train::run_fingerprint).
std::unique_ptr<ReplicaGroups> join_replica_groups(comm::Communicator& world,
                                                   const ReplicaGroupsConfig& groups,
                                                   const train::TrainConfig& config,
                                                   const train::Task& task);

}  // namespace meshtensor::ft
