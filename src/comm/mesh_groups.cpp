#include <map>

#include <fmt/format.h>

#include <meshtensor/comm/calibrate.hpp>
#include <meshtensor/comm/mesh_groups.hpp>
#include <meshtensor/core/error.hpp>

namespace meshtensor::comm {

MeshGroups::MeshGroups(DeviceMesh mesh, std::shared_ptr<Communicator> world)
    : mesh_(std::move(mesh)), world_(std::move(world)) {
  if (!world_) throw InvalidArgument("MeshGroups needs a world communicator");
  if (world_->size() != mesh_.size()) {
    throw InvalidArgument(fmt::format("mesh {} has {} ranks but the world communicator has {}",
                                      mesh_.to_string(), mesh_.size(), world_->size()));
  }
  by_ranks_[{world_->world_ranks(), 0}] = world_;
  if (const std::shared_ptr<const Topology> job = world_->topology()) {
    // Mesh rank r is world rank world_ranks()[r]: the job's placement, renumbered.
    std::vector<int> hosts;
    std::vector<int> domains;
    std::vector<std::string> names;
    for (int h = 0; h < job->hosts(); ++h)
      names.push_back(job->host_name(h));
    for (const std::int64_t member : world_->world_ranks()) {
      hosts.push_back(job->host(member));
      domains.push_back(job->domain(member));
    }
    topology_ = std::make_shared<const Topology>(std::move(hosts), std::move(domains),
                                                 std::move(names), job->links());
  }
}

std::shared_ptr<Communicator> MeshGroups::group(std::span<const int> dims,
                                                const CollectiveOptions& options, int channel) {
  if (channel < 0) throw InvalidArgument(fmt::format("channel {} is negative", channel));
  std::vector<std::int64_t> members = mesh_.group_ranks(rank(), dims);
  // Mesh rank -> world rank (the world communicator may itself be a sub-group of a larger job).
  for (std::int64_t& member : members)
    member = world_->world_ranks()[static_cast<std::size_t>(member)];
  if (auto found = by_ranks_.find({members, channel}); found != by_ranks_.end())
    return found->second;
  // Translation invariance of mesh groups: every rank misses the cache for the same dims, so
  // this split is reached collectively. Color: the group's first mesh rank; key: the position.
  const std::int64_t color = mesh_.group_ranks(rank(), dims).front();
  auto created = world_->split(color, mesh_.group_position(rank(), dims), options);
  if (created->world_ranks() != members) {
    throw CommError(fmt::format("group over mesh dims [{}] came out as ranks [{}], expected [{}]",
                                fmt::join(dims, ","), fmt::join(created->world_ranks(), ","),
                                fmt::join(members, ",")));
  }
  by_ranks_[{members, channel}] = created;
  return created;
}

bool MeshGroups::splits_alike(std::span<const int> dims) const {
  std::vector<std::vector<int>> first;
  for (std::int64_t r = 0; r < mesh_.size(); ++r) {
    if (mesh_.group_position(r, dims) != 0) continue;
    std::vector<std::vector<int>> split = unit_positions(*topology_, mesh_.group_ranks(r, dims));
    if (first.empty()) {
      first = std::move(split);
    } else if (split != first) {
      return false;
    }
  }
  return true;
}

namespace {

/// Where group position `me` sits in `positions` (unit_positions): its unit and its place there.
std::pair<int, int> unit_and_place(const std::vector<std::vector<int>>& positions, int me) {
  for (std::size_t u = 0; u < positions.size(); ++u) {
    const auto& places = positions[u];
    for (std::size_t l = 0; l < places.size(); ++l) {
      if (places[l] == me) return {static_cast<int>(u), static_cast<int>(l)};
    }
  }
  throw InvalidArgument(fmt::format("group position {} is on no unit", me));
}

}  // namespace

std::shared_ptr<Communicator> MeshGroups::unit_group(std::span<const int> dims,
                                                     const CollectiveOptions& options,
                                                     int channel) {
  if (channel < 0) throw InvalidArgument(fmt::format("channel {} is negative", channel));
  const std::pair<std::vector<int>, int> key{std::vector<int>(dims.begin(), dims.end()), channel};
  if (auto found = unit_groups_.find(key); found != unit_groups_.end()) return found->second;
  std::vector<std::int64_t> members = mesh_.group_ranks(rank(), dims);
  const std::vector<std::vector<int>> positions = unit_positions(*topology_, members);
  const auto [unit, place] =
      unit_and_place(positions, static_cast<int>(mesh_.group_position(rank(), dims)));
  const std::vector<int>& mine = positions[static_cast<std::size_t>(unit)];
  // Colors: the first mesh rank of each unit group, unique among the disjoint unit groups.
  auto created = world_->split(members[static_cast<std::size_t>(mine.front())], place, options);
  std::vector<std::int64_t> expected;
  for (const int position : mine)
    expected.push_back(
        world_
            ->world_ranks()[static_cast<std::size_t>(members[static_cast<std::size_t>(position)])]);
  if (created->world_ranks() != expected) {
    throw CommError(fmt::format(
        "unit group over mesh dims [{}] came out as ranks [{}], expected [{}]",
        fmt::join(dims, ","), fmt::join(created->world_ranks(), ","), fmt::join(expected, ",")));
  }
  unit_groups_.emplace(key, created);
  return created;
}

std::shared_ptr<Communicator> MeshGroups::two_level_group(std::span<const int> dims,
                                                          TwoLevelChoice choice,
                                                          const CollectiveOptions& options,
                                                          int channel) {
  const std::tuple<std::vector<int>, int, int> key{std::vector<int>(dims.begin(), dims.end()),
                                                   channel, static_cast<int>(choice)};
  if (auto found = two_level_.find(key); found != two_level_.end()) return found->second;
  if (choice == TwoLevelChoice::by_price && !topology_->single_level() && !costs_measured_) {
    local_costs_ = measure_local_costs(*world_);
    costs_measured_ = true;
  }
  std::shared_ptr<Communicator> flat = group(dims, options, channel);
  const std::vector<std::int64_t> members = mesh_.group_ranks(rank(), dims);
  const GroupSpread spread = spread_of(*topology_, members);
  // Units: hosts, or the domains of one host; in topology order. Places: group order.
  const std::vector<std::vector<int>> positions = unit_positions(*topology_, members);
  const auto me = static_cast<int>(mesh_.group_position(rank(), dims));
  const auto [my_unit, my_place] = unit_and_place(positions, me);
  // Both splits run on every rank (the cache miss is collective); colors are the first mesh
  // rank of each new group, unique among the groups one split makes.
  const auto world_of = [&](int position) { return members[static_cast<std::size_t>(position)]; };
  const std::int64_t inner_color = world_of(positions[static_cast<std::size_t>(my_unit)].front());
  auto inner = world_->split(inner_color, my_place, options);
  // Outer: the members at this place on every unit; on jagged units, a private copy of the
  // group for the exchange across units (colors stay unique: the groups along dims are disjoint).
  std::int64_t outer_color = world_of(0);
  std::int64_t outer_key = me;
  if (spread.per_unit > 0) {
    outer_color = world_of(positions.front()[static_cast<std::size_t>(my_place)]);
    outer_key = my_unit;
  }
  auto outer = world_->split(outer_color, outer_key, options);
  std::shared_ptr<Communicator> made = flat;
  if (spread.level != LinkLevel::domain && spread.units > 1 && spread.most > 1) {
    made = std::make_shared<TwoLevelCommunicator>(flat, std::move(inner), std::move(outer),
                                                  positions, spread, topology_, choice,
                                                  local_costs_, splits_alike(dims));
  }
  two_level_.emplace(key, made);
  return made;
}

}  // namespace meshtensor::comm
