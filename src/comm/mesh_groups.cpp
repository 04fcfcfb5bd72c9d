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

}  // namespace meshtensor::comm
