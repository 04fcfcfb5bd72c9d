#include <algorithm>
#include <chrono>
#include <exception>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <meshtensor/comm/agree.hpp>
#include <meshtensor/core/error.hpp>
#include <meshtensor/ft/group_communicator.hpp>
#include <meshtensor/ft/group_context.hpp>
#include <meshtensor/ft/replica_groups.hpp>

#include "line_socket.hpp"

namespace meshtensor::ft {

void validate_replica_groups(const ReplicaGroupsConfig& config) {
  if (config.groups < 0)
    throw InvalidArgument(fmt::format("replica groups {} is negative", config.groups));
  if (config.groups == 0) {
    if (config.group != 0 || !config.coordinator.empty()) {
      throw InvalidArgument(
          "a replica group or a coordinator is given without --replica-groups (the run's number "
          "of groups)");
    }
    return;
  }
  if (config.group < 0 || config.group >= config.groups) {
    throw InvalidArgument(
        fmt::format("replica group {} is not one of the run's {} groups (0 .. {})", config.group,
                    config.groups, config.groups - 1));
  }
  if (config.min_groups < 1 || config.min_groups > config.groups) {
    throw InvalidArgument(fmt::format("the smallest quorum {} is not between 1 and the {} groups",
                                      config.min_groups, config.groups));
  }
  if (!(config.timeout > 0) || !(config.coordinator_timeout > 0)) {
    throw InvalidArgument(fmt::format("replica timeouts {} and {} s must be positive",
                                      config.timeout, config.coordinator_timeout));
  }
  if (config.coordinator.empty())
    throw InvalidArgument("a fault-tolerant run needs --coordinator HOST:PORT");
  parse_address(config.coordinator);
}

train::TrainConfig replica_group_defaults(train::TrainConfig config,
                                          const ReplicaGroupsConfig& groups, bool layout_given) {
  validate_replica_groups(groups);
  if (groups.groups > 0 && !layout_given) config.strategy = train::Strategy::fsdp;
  return config;
}

/// One quorum's data plane on this rank: the context and its communicator (declared in this
/// order so that the communicator goes first).
struct ReplicaGroups::Plane {
  std::unique_ptr<GroupContext> context;
  std::shared_ptr<GroupCommunicator> communicator;
};

ReplicaGroups::ReplicaGroups(comm::Communicator& world, ReplicaGroupsConfig config,
                             std::string fingerprint)
    : world_(world), config_(std::move(config)), host_(config_.host) {
  validate_replica_groups(config_);
  std::exception_ptr failure;
  try {
    if (host_.empty()) host_ = StoreClient(config_.coordinator, config_.timeout).local_host();
    if (world_.rank() == 0) {
      client_ = std::make_unique<CoordinatorClient>(
          config_.coordinator, config_.group,
          RunShape{config_.groups, config_.min_groups, std::move(fingerprint)}, config_.timeout);
    }
  } catch (const DataError&) {
    failure = std::current_exception();
  } catch (const CommError& e) {
    failure = std::make_exception_ptr(
        CommError(fmt::format("replica group {} cannot reach its coordinator {}: {}", config_.group,
                              config_.coordinator, e.what())));
  } catch (...) {
    failure = std::current_exception();
  }
  comm::throw_if_any_failed(world_, failure);
}

ReplicaGroups::~ReplicaGroups() = default;

Quorum ReplicaGroups::ask(std::int64_t step, bool fresh) {
  // Each ask waits this long for its round; the coordinator answers when it has none by then.
  constexpr double kRound = 60.0;
  auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(config_.coordinator_timeout);
  // While the coordinator is away and the plane holds, it is tried again every few seconds, not
  // every step (each try may wait out a connect).
  constexpr auto kRetry = std::chrono::seconds(5);
  if (coordinator_lost_ && !fresh && plane_ != nullptr &&
      std::chrono::steady_clock::now() - last_try_ < kRetry)
    return going_on_without_coordinator(step);
  for (;;) {
    std::optional<Quorum> formed;
    last_try_ = std::chrono::steady_clock::now();
    try {
      formed = client_->try_quorum(step, kRound, fresh);
    } catch (const TimeoutError&) {
      // The coordinator answers but has no round yet (fewer than the fewest groups are live).
      deadline = std::chrono::steady_clock::now() +
                 std::chrono::duration<double>(config_.coordinator_timeout);
      continue;
    }
    if (formed) {
      if (coordinator_lost_) {
        notes_.push_back(fmt::format("coordinator {} is back at step {}: quorum {} of groups {}",
                                     config_.coordinator, step, formed->id,
                                     fmt::join(formed->members, ", ")));
      }
      coordinator_lost_ = false;
      return *formed;
    }
    if (current_ && !fresh && plane_ != nullptr) return going_on_without_coordinator(step);
    if (std::chrono::steady_clock::now() >= deadline) {
      throw CommError(fmt::format(
          "coordinator {} unreachable for {} s: replica group {} cannot form a quorum for step {} "
          "without it ({})",
          config_.coordinator, config_.coordinator_timeout, config_.group, step,
          client_->unreachable()));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
}

Quorum ReplicaGroups::going_on_without_coordinator(std::int64_t step) {
  if (!coordinator_lost_) {
    notes_.push_back(fmt::format(
        "coordinator {} unreachable at step {} ({}): groups {} go on in quorum {} until it is "
        "back",
        config_.coordinator, step, client_->unreachable(), fmt::join(current_->members, ", "),
        current_->id));
  }
  coordinator_lost_ = true;
  Quorum same = *current_;
  same.step = step;
  same.heal_from.clear();
  return same;
}

bool ReplicaGroups::build_plane(const Quorum& quorum) {
  plane_.reset();
  if (quorum.members.size() < 2) return true;
  auto plane = std::make_shared<Plane>();
  try {
    plane->context = std::make_unique<GroupContext>(config_.coordinator, config_.group, quorum,
                                                    fmt::format("rank{}", world_.rank()), host_,
                                                    config_.timeout);
  } catch (const CommError&) {
    return false;
  }
  plane->communicator =
      std::make_shared<GroupCommunicator>(*plane->context, GroupCommunicator::OnFailure::record);
  plane_ = std::move(plane);
  return true;
}

std::optional<train::ReplicaLink::StepQuorum> ReplicaGroups::begin_step(std::int64_t step,
                                                                        bool fresh) {
  std::string text;
  std::exception_ptr failure;
  if (world_.rank() == 0) {
    try {
      text = quorum_text(ask(step, fresh));
    } catch (...) {
      failure = std::current_exception();
    }
  }
  comm::throw_if_any_failed(world_, failure);
  const Quorum quorum = parse_quorum(comm::broadcast_text(world_, text, 0));
  bool met = true;
  if (!current_ || quorum.id != current_->id || quorum.coordinator != current_->coordinator)
    met = build_plane(quorum);
  current_ = quorum;
  if (comm::on_any_rank(world_, !met)) {
    current_.reset();
    plane_.reset();
    return std::nullopt;
  }
  const auto place = [&](std::int64_t group) {
    return static_cast<int>(std::find(quorum.members.begin(), quorum.members.end(), group) -
                            quorum.members.begin());
  };
  StepQuorum taken;
  taken.step = quorum.step;
  taken.member = place(config_.group);
  taken.members = static_cast<int>(quorum.members.size());
  if (!quorum.heal_from.empty()) taken.heal_root = place(quorum.heal_from.begin()->second);
  if (plane_)
    taken.replicate = std::shared_ptr<comm::Communicator>(plane_, plane_->communicator.get());
  return taken;
}

bool ReplicaGroups::broadcast(std::span<char> bytes, int root) {
  if (!plane_) return true;  // alone: nothing to pass on
  try {
    plane_->context->broadcast(bytes, root);
    return true;
  } catch (const CommError&) {
    return false;
  }
}

bool ReplicaGroups::failed() {
  return plane_ != nullptr && !plane_->communicator->failure().empty();
}

std::vector<std::string> ReplicaGroups::take_notes() {
  return std::exchange(notes_, {});
}

std::unique_ptr<ReplicaGroups> join_replica_groups(comm::Communicator& world,
                                                   const ReplicaGroupsConfig& groups,
                                                   const train::TrainConfig& config,
                                                   const train::Task& task) {
  if (groups.groups == 0) return nullptr;
  return std::make_unique<ReplicaGroups>(world, groups,
                                         train::run_fingerprint(config, task, world.size()));
}

}  // namespace meshtensor::ft
