#include <map>

#include <fmt/format.h>

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

std::shared_ptr<Communicator> MeshGroups::two_level_group(std::span<const int> dims,
                                                          TwoLevelChoice choice,
                                                          const CollectiveOptions& options,
                                                          int channel) {
  const std::tuple<std::vector<int>, int, int> key{std::vector<int>(dims.begin(), dims.end()),
                                                   channel, static_cast<int>(choice)};
  if (auto found = two_level_.find(key); found != two_level_.end()) return found->second;
  std::shared_ptr<Communicator> flat = group(dims, options, channel);
  const std::vector<std::int64_t> members = mesh_.group_ranks(rank(), dims);
  const GroupSpread spread = spread_of(*topology_, members);
  // Units: hosts, or the domains of one host; in topology order. Places: group order.
  std::map<int, std::vector<int>> by_unit;
  for (std::size_t p = 0; p < members.size(); ++p) {
    const std::int64_t r = members[p];
    const int unit = spread.level == LinkLevel::network ? topology_->host(r) : topology_->domain(r);
    by_unit[unit].push_back(static_cast<int>(p));
  }
  int my_unit = 0;
  int my_place = 0;
  std::vector<std::vector<int>> positions;
  const auto me = static_cast<int>(mesh_.group_position(rank(), dims));
  for (const auto& [unit, places] : by_unit) {
    for (std::size_t l = 0; l < places.size(); ++l) {
      if (places[l] == me) {
        my_unit = static_cast<int>(positions.size());
        my_place = static_cast<int>(l);
      }
    }
    positions.push_back(places);
  }
  // Both splits run on every rank (the cache miss is collective); colors are the first mesh
  // rank of each new group, unique among the groups one split makes.
  const auto world_of = [&](int position) { return members[static_cast<std::size_t>(position)]; };
  const std::int64_t inner_color = world_of(positions[static_cast<std::size_t>(my_unit)].front());
  auto inner = world_->split(inner_color, my_place, options);
  std::int64_t outer_color = -1;
  for (const auto& places : positions) {
    if (static_cast<std::size_t>(my_place) < places.size()) {
      outer_color = world_of(places[static_cast<std::size_t>(my_place)]);
      break;
    }
  }
  auto outer = world_->split(outer_color, my_unit, options);
  std::shared_ptr<Communicator> made = flat;
  if (spread.level != LinkLevel::domain && spread.units > 1 && spread.per_unit > 1) {
    made = std::make_shared<TwoLevelCommunicator>(flat, std::move(inner), std::move(outer),
                                                  std::move(positions), spread, topology_, choice);
  }
  two_level_.emplace(key, made);
  return made;
}

}  // namespace meshtensor::comm
