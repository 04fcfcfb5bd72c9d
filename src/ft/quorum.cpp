#include <algorithm>
#include <limits>

#include <fmt/format.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/ft/quorum.hpp>

namespace meshtensor::ft {

QuorumState::QuorumState(QuorumRules rules) : rules_(rules) {
  if (!(rules.heartbeat_timeout > 0) || !(rules.quorum_wait > 0)) {
    throw InvalidArgument(
        fmt::format("heartbeat timeout {} s and quorum wait {} s must be positive",
                    rules.heartbeat_timeout, rules.quorum_wait));
  }
}

void QuorumState::expire(double now) {
  for (auto it = groups_.begin(); it != groups_.end();) {
    if (now - it->second.last_heard > rules_.heartbeat_timeout) {
      it = groups_.erase(it);
    } else {
      ++it;
    }
  }
}

QuorumState::Group* QuorumState::live_group(std::int64_t group, const std::string& incarnation) {
  const auto it = groups_.find(group);
  if (it == groups_.end() || it->second.incarnation != incarnation) return nullptr;
  return &it->second;
}

namespace {

/// The entries of two "; "-separated texts around their first difference, each from the ';'
/// before it to the ';' after it: "layout fsdp over 2 ranks" against "layout tp over 2 ranks".
std::pair<std::string, std::string> first_difference(const std::string& a, const std::string& b) {
  const auto separator = [](char c) { return c == ';'; };
  std::size_t at = 0;
  while (at < a.size() && at < b.size() && a[at] == b[at])
    ++at;
  std::size_t begin = at;
  while (begin > 0 && !separator(a[begin - 1]))
    --begin;
  const auto piece = [&](const std::string& text) {
    std::size_t end = std::max(begin, std::min(at, text.size()));
    while (end < text.size() && !separator(text[end]))
      ++end;
    const std::size_t first = text.find_first_not_of(' ', begin);
    return first >= end ? std::string() : text.substr(first, end - first);
  };
  return {piece(a), piece(b)};
}

}  // namespace

void QuorumState::join(std::int64_t group, const std::string& incarnation, const RunShape& shape,
                       double now, std::int64_t link) {
  expire(now);
  if (shape.groups < 1 || shape.min_groups < 1 || shape.min_groups > shape.groups) {
    throw DataError(
        fmt::format("a quorum of at least {} of {} replica groups: need 1 <= min groups <= groups",
                    shape.min_groups, shape.groups));
  }
  if (groups_.empty()) {
    // No group is live: the next run begins (the ids go on, so no context key is reused).
    shaped_ = false;
    const std::int64_t id = last_.id;
    last_ = Quorum();
    last_.id = id;
  }
  if (shaped_ && shape.fingerprint != shape_.fingerprint) {
    const auto [mine, theirs] = first_difference(shape.fingerprint, shape_.fingerprint);
    throw DataError(fmt::format(
        "replica group {} runs another model, layout or settings than the run's groups: '{}' "
        "where they have '{}' (every group must give the same; its whole run: {})",
        group, mine, theirs, shape.fingerprint));
  }
  if (shaped_ && (shape.groups != shape_.groups || shape.min_groups != shape_.min_groups)) {
    throw DataError(fmt::format(
        "replica group {} says the run has {} groups (quorum at least {}), but the run's groups "
        "say {} (at least {})",
        group, shape.groups, shape.min_groups, shape_.groups, shape_.min_groups));
  }
  if (group < 0 || group >= shape.groups) {
    throw DataError(fmt::format("replica group {} is not one of the run's {} groups (0 to {})",
                                group, shape.groups, shape.groups - 1));
  }
  const auto it = groups_.find(group);
  if (it != groups_.end() && it->second.incarnation != incarnation) {
    throw DataError(fmt::format(
        "replica group {} joined twice: it is live already (last heard {:.1f} s ago); stop that "
        "process first, or give this one another --replica-group",
        group, now - it->second.last_heard));
  }
  shape_ = shape;
  shaped_ = true;
  Group& entry = groups_[group];
  entry.incarnation = incarnation;
  entry.last_heard = now;
  entry.link = link;
}

bool QuorumState::heartbeat(std::int64_t group, const std::string& incarnation, double now) {
  expire(now);
  Group* entry = live_group(group, incarnation);
  if (entry == nullptr) return false;
  entry->last_heard = now;
  return true;
}

void QuorumState::leave(std::int64_t group, const std::string& incarnation, std::int64_t link) {
  const Group* entry = live_group(group, incarnation);
  if (entry != nullptr && entry->link == link) groups_.erase(group);
}

bool QuorumState::ask(std::int64_t group, const std::string& incarnation, std::int64_t step,
                      double now, bool fresh) {
  expire(now);
  Group* entry = live_group(group, incarnation);
  if (entry == nullptr) return false;
  entry->last_heard = now;
  if (!entry->asked_step) entry->asked_at = now;
  entry->asked_step = step;
  entry->fresh = entry->fresh || fresh;
  return true;
}

std::optional<Quorum> QuorumState::form(double now) {
  expire(now);
  std::vector<std::int64_t> asked;
  double first_ask = std::numeric_limits<double>::infinity();
  std::int64_t furthest = -1;
  for (const auto& [group, entry] : groups_) {
    if (!entry.asked_step) continue;
    asked.push_back(group);
    furthest = std::max(furthest, *entry.asked_step);
    // Only a group at the run's step starts the wait: one behind it (restarted) waits for them.
    if (*entry.asked_step >= last_.step) first_ask = std::min(first_ask, entry.asked_at);
  }
  const auto count = static_cast<std::int64_t>(asked.size());
  // The first round waits for every group of the run (one not yet joined is not live yet);
  // later rounds for every live one.
  const bool everyone = count == static_cast<std::int64_t>(groups_.size()) &&
                        (last_.round > 0 || count == shape_.groups);
  const bool waited = now - first_ask >= rules_.quorum_wait;
  if (!shaped_ || count < shape_.min_groups || (!everyone && !waited)) return std::nullopt;
  return take_round(asked, furthest);
}

Quorum QuorumState::take_round(const std::vector<std::int64_t>& asked, std::int64_t step) {
  Quorum quorum;
  quorum.round = last_.round + 1;
  quorum.members = asked;
  quorum.fingerprint = shape_.fingerprint;
  quorum.step = step;
  std::int64_t source = -1;
  bool fresh = asked != last_.members;
  for (const std::int64_t group : asked) {
    const Group& entry = groups_[group];
    if (*entry.asked_step == step && source < 0) source = group;
    fresh = fresh || entry.fresh;
  }
  for (const std::int64_t group : asked) {
    Group& entry = groups_[group];
    if (*entry.asked_step < step) quorum.heal_from[group] = source;
    entry.asked_step.reset();
    entry.fresh = false;
  }
  quorum.id = fresh || !quorum.heal_from.empty() ? last_.id + 1 : last_.id;
  last_ = quorum;
  return quorum;
}

std::vector<std::int64_t> QuorumState::live() const {
  std::vector<std::int64_t> all;
  for (const auto& [group, entry] : groups_)
    all.push_back(group);
  return all;
}

}  // namespace meshtensor::ft
