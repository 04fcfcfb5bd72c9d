#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace meshtensor::ft {

/// The coordinator's rules, without sockets or clocks: times are seconds on any monotonic clock
/// the caller reads.
struct QuorumRules {
  double heartbeat_timeout = 10.0;  ///< a group silent this long is dropped
  double quorum_wait = 1.0;         ///< how long a round waits for live groups that have not asked
};

/// What a group's process says of the run when it joins: every group of a run says the same.
struct RunShape {
  std::int64_t groups = 1;      ///< replica groups the run has (--replica-groups)
  std::int64_t min_groups = 1;  ///< fewest groups a quorum may have
  /// The model, layout and settings every group must share (a digest of them and their text).
  std::string fingerprint;
  bool operator==(const RunShape&) const = default;
};

/// One round's decision: the groups that take the step and what each must do first.
struct Quorum {
  /// The data plane's generation: increases when a round's members differ from the last
  /// round's, when a member heals, or when a member asked for fresh contexts (its own failed);
  /// members rebuild their contexts when it changes and keep them otherwise.
  std::int64_t id = 0;
  std::int64_t round = 0;  ///< increases with every round the coordinator forms
  /// The incarnation of the coordinator that formed it: ids restart with a restarted one.
  std::string coordinator;
  std::int64_t step = 0;              ///< the step the members take: the furthest any asked for
  std::vector<std::int64_t> members;  ///< ascending
  /// Members behind the step (restarted groups), each with the member to heal from: the
  /// lowest-numbered member at the step.
  std::map<std::int64_t, std::int64_t> heal_from;
  /// The fingerprint every member runs (the model, layout and settings).
  std::string fingerprint;
  bool operator==(const Quorum&) const = default;
};

/// What the coordinator knows of the groups: who joined (with which incarnation, a restarted
/// process's new one), who is live, who asked for the next quorum. The state is soft: after a
/// coordinator restart the groups join and ask again, and the state they report (their steps)
/// is the truth, so nothing is lost.
class QuorumState {
 public:
  /// InvalidArgument naming the values unless the timeouts are positive.
  explicit QuorumState(QuorumRules rules);

  /// A group's process joins (or rejoins after a restart: another incarnation). The first
  /// joiner sets the run's shape (DataError unless 1 <= min_groups <= groups); DataError naming
  /// both when a later joiner's shape is not the run's, naming the group when it is out of range
  /// or already live under another incarnation (a group joined twice).
  /// `link` names the connection it joined on (leave() of another link of the same incarnation,
  /// an old connection closing after the group joined again on a new one, changes nothing).
  void join(std::int64_t group, const std::string& incarnation, const RunShape& shape, double now,
            std::int64_t link = 0);
  /// A heartbeat from a group's incarnation; false when that incarnation is not live (dropped or
  /// replaced): it must join again.
  bool heartbeat(std::int64_t group, const std::string& incarnation, double now);
  /// The incarnation's connection closed: it is gone at once, without waiting for its timeout.
  void leave(std::int64_t group, const std::string& incarnation, std::int64_t link = 0);
  /// The group is ready for `step` and waits for a quorum (`fresh`: it needs new contexts, its
  /// own having failed); false when the incarnation is not live.
  bool ask(std::int64_t group, const std::string& incarnation, std::int64_t step, double now,
           bool fresh = false);
  /// Drops silent groups, then forms the round's quorum when it can: every live group asked (at
  /// least min_groups of them; for the run's first quorum, every group of the run), or
  /// min_groups asked and the first ask has waited quorum_wait. Askers that are all behind the
  /// last quorum's step (restarted groups) do not form a round by waiting while a live group
  /// that has not asked may be at it: they wait for it, or for it to be dropped.
  /// Its members' asks are consumed; groups that ask later wait for the next round.
  std::optional<Quorum> form(double now);
  /// The last quorum formed (id 0: none yet).
  const Quorum& last() const { return last_; }
  /// Live groups, ascending.
  std::vector<std::int64_t> live() const;
  /// The run's shape (fingerprint empty until a group joined).
  const RunShape& shape() const { return shape_; }

 private:
  struct Group {
    std::string incarnation;
    double last_heard = 0;
    std::optional<std::int64_t> asked_step;
    double asked_at = 0;
    bool fresh = false;
    std::int64_t link = 0;
  };
  void expire(double now);
  /// The round of `asked` at `step`; consumes their asks.
  Quorum take_round(const std::vector<std::int64_t>& asked, std::int64_t step);
  Group* live_group(std::int64_t group, const std::string& incarnation);

  QuorumRules rules_;
  RunShape shape_;
  bool shaped_ = false;
  std::map<std::int64_t, Group> groups_;
  Quorum last_;
};

}  // namespace meshtensor::ft
