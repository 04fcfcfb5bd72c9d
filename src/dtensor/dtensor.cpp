#include <fmt/format.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/dtensor/comm_debug.hpp>
#include <meshtensor/dtensor/dtensor.hpp>
#include <meshtensor/mesh/layout.hpp>

namespace meshtensor::dtensor {

DTensor::DTensor(std::shared_ptr<comm::MeshGroups> groups, PlacementSpec spec, Shape global_shape,
                 Tensor local)
    : groups_(std::move(groups)),
      spec_(std::move(spec)),
      global_shape_(std::move(global_shape)),
      local_(std::move(local)) {
  if (!groups_) throw InvalidArgument("a DTensor needs the mesh's groups, got none");
  const Layout layout = local_layout(groups_->mesh(), spec_, global_shape_, groups_->rank());
  if (!local_.defined() || local_.shape() != layout.local_shape) {
    throw InvalidArgument(fmt::format(
        "rank {}: spec {} of a {} tensor on mesh {} gives this rank a {} block, not {}",
        groups_->rank(), spec_.to_string(), global_shape_.to_string(), groups_->mesh().to_string(),
        layout.local_shape.to_string(),
        local_.defined() ? local_.shape().to_string() : std::string("an undefined tensor")));
  }
}

DTensor DTensor::redistribute(const PlacementSpec& spec, const RedistributeOptions& options) const {
  const auto plan = plan_for(*groups_, spec_, spec, global_shape_, dtype(), options);
  if (CommDebugMode* mode = CommDebugMode::active())
    mode->add_plan(*plan, groups_->rank(), spec_.to_string() + " -> " + spec.to_string());
  return {groups_, spec, global_shape_, execute_plan(*plan, *groups_, local_, options)};
}

Tensor DTensor::full_tensor(const RedistributeOptions& options) const {
  const PlacementSpec replicated(
      std::vector<Placement>(static_cast<std::size_t>(spec_.mesh_ndim()), Placement::replicate()));
  return redistribute(replicated, options).local();
}

DTensor distribute(const Tensor& global, std::shared_ptr<comm::MeshGroups> groups,
                   const PlacementSpec& spec) {
  if (!groups) throw InvalidArgument("distribute needs the mesh's groups, got none");
  const DeviceMesh& mesh = groups->mesh();
  const Layout layout = local_layout(mesh, spec, global.shape(), groups->rank());
  Tensor local = local_view(global, layout).clone();
  keep_partial_sums_on_first(local, mesh, spec, groups->rank());
  return {std::move(groups), spec, global.shape(), std::move(local)};
}

void keep_partial_sums_on_first(Tensor& local, const DeviceMesh& mesh, const PlacementSpec& spec,
                                std::int64_t rank) {
  std::vector<int> sum_dims;
  for (int m = 0; m < spec.mesh_ndim(); ++m) {
    if (spec.at(m).is_partial() && spec.at(m).reduce_op() == ReduceOp::sum) sum_dims.push_back(m);
  }
  if (mesh.group_position(rank, sum_dims) != 0) local.fill(0);
}

DTensor from_local(Tensor local, std::shared_ptr<comm::MeshGroups> groups,
                   const PlacementSpec& spec, const Shape& global_shape) {
  return {std::move(groups), spec, global_shape, std::move(local)};
}

}  // namespace meshtensor::dtensor
