#include <algorithm>
#include <chrono>
#include <set>

#include <fmt/format.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/dtensor/redistribute.hpp>
#include <meshtensor/mesh/layout.hpp>
#include <meshtensor/rl/weight_sync.hpp>

namespace meshtensor::rl {

namespace {

using Clock = std::chrono::steady_clock;

/// Inner and outer stride of every dim of `mesh` (row-major ranks).
std::vector<std::pair<std::int64_t, std::int64_t>> strides(const DeviceMesh& mesh) {
  std::vector<std::pair<std::int64_t, std::int64_t>> result(static_cast<std::size_t>(mesh.ndim()));
  std::int64_t inner = 1;
  for (int d = mesh.ndim() - 1; d >= 0; --d) {
    result[static_cast<std::size_t>(d)] = {inner, inner * mesh.size(d)};
    inner *= mesh.size(d);
  }
  return result;
}

/// The joint dims (major first) lying between the strides of one dim.
std::vector<int> run_of(std::pair<std::int64_t, std::int64_t> dim,
                        const std::vector<std::int64_t>& bounds) {
  std::vector<int> run;
  const auto dims = static_cast<int>(bounds.size()) - 1;
  for (int k = dims - 1; k >= 0; --k) {
    const auto at = static_cast<std::size_t>(k);
    if (bounds[at] >= dim.first && bounds[at + 1] <= dim.second) run.push_back(dims - 1 - k);
  }
  return run;
}

/// The spec of the generator's parameter `p` on a GeneratorLayout mesh: its tp split (the dim
/// where its block differs from the whole tensor), replicated over the replicas.
PlacementSpec generator_spec(const nn::Parameter& p) {
  const Shape whole = p.global_shape();
  Placement split = Placement::replicate();
  for (int d = 0; d < whole.rank(); ++d)
    if (whole[d] != p.value.shape()[d]) split = Placement::shard(d);
  return PlacementSpec(std::vector<Placement>{Placement::replicate(), split});
}

/// `spec` with Replicate on every mesh dim that `keep` says is not kept (the shard order of the
/// dims left unchanged).
PlacementSpec replicated_except(const PlacementSpec& spec, const std::vector<bool>& keep) {
  std::vector<Placement> placements = spec.placements();
  std::vector<int> levels(placements.size(), 0);
  for (int d = 0; d <= spec.max_shard_dim(); ++d) {
    int level = 0;
    for (const int m : spec.shard_mesh_dims(d))
      if (keep[static_cast<std::size_t>(m)]) levels[static_cast<std::size_t>(m)] = level++;
  }
  for (std::size_t d = 0; d < placements.size(); ++d)
    if (!keep[d]) placements[d] = Placement::replicate();
  return PlacementSpec(placements, levels);
}

/// Received bytes of every rank over the plan's collectives, added to `totals`.
void add_received(const plan::Plan& plan, std::vector<std::int64_t>& totals) {
  for (const plan::Step& step : plan.steps) {
    if (!plan::is_collective(step.kind)) continue;
    for (std::size_t r = 0; r < totals.size() && r < step.traffic.recv_bytes.size(); ++r)
      totals[r] += step.traffic.recv_bytes[r];
  }
}

}  // namespace

DeviceMesh GeneratorLayout::mesh() const {
  return DeviceMesh({replicas, tp}, {"dp", "tp"});
}

std::string GeneratorLayout::describe() const {
  return fmt::format("{}x{} (dp x tp)", replicas, tp);
}

std::unique_ptr<JointMesh> joint_mesh(const DeviceMesh& first, const DeviceMesh& second) {
  if (first.size() != second.size()) {
    throw InvalidArgument(fmt::format("meshes {} and {} have different rank counts ({} and {})",
                                      first.to_string(), second.to_string(), first.size(),
                                      second.size()));
  }
  std::set<std::int64_t> bounds_set{1};
  for (const DeviceMesh* mesh : {&first, &second})
    for (const auto& [inner, outer] : strides(*mesh)) {
      bounds_set.insert(inner);
      bounds_set.insert(outer);
    }
  const std::vector<std::int64_t> bounds(bounds_set.begin(), bounds_set.end());
  for (std::size_t k = 0; k + 1 < bounds.size(); ++k)
    if (bounds[k + 1] % bounds[k] != 0) return nullptr;
  std::vector<std::int64_t> sizes;
  for (std::size_t k = bounds.size() - 1; k > 0; --k)
    sizes.push_back(bounds[k] / bounds[k - 1]);
  if (sizes.empty()) sizes.push_back(1);
  auto joint = std::make_unique<JointMesh>(JointMesh{DeviceMesh(sizes), {}, {}});
  for (const auto& dim : strides(first))
    joint->first_runs.push_back(run_of(dim, bounds));
  for (const auto& dim : strides(second))
    joint->second_runs.push_back(run_of(dim, bounds));
  return joint;
}

std::unique_ptr<PlacementSpec> spec_on_joint(const DeviceMesh& mesh, const PlacementSpec& spec,
                                             const JointMesh& joint,
                                             const std::vector<std::vector<int>>& runs,
                                             const Shape& shape) {
  const auto dims = static_cast<std::size_t>(joint.mesh.ndim());
  std::vector<Placement> placements(dims, Placement::replicate());
  std::vector<int> levels(dims, 0);
  for (std::size_t m = 0; m < runs.size(); ++m)
    for (const int j : runs[m])
      placements[static_cast<std::size_t>(j)] = spec.at(static_cast<int>(m));
  for (int d = 0; d < shape.rank(); ++d) {
    int level = 0;
    for (const int m : spec.shard_mesh_dims(d))
      for (const int j : runs[static_cast<std::size_t>(m)])
        levels[static_cast<std::size_t>(j)] = level++;
  }
  auto joined = std::make_unique<PlacementSpec>(placements, levels);
  for (std::int64_t r = 0; r < mesh.size(); ++r) {
    const Layout want = local_layout(mesh, spec, shape, r);
    const Layout have = local_layout(joint.mesh, *joined, shape, r);
    if (want.local_shape != have.local_shape || want.global_offset != have.global_offset)
      return nullptr;
  }
  return joined;
}

/// One parameter's way from the trainer to the generator: an optional gather on the trainer's
/// mesh, the redistribute on the joint mesh, an optional local cut on the generator's mesh.
struct WeightSync::Move {
  train::TrainingModel::PlacedParameter source;
  nn::Parameter* target = nullptr;
  std::shared_ptr<const plan::Plan> gather_first;
  std::shared_ptr<const plan::Plan> joint;
  std::shared_ptr<const plan::Plan> cut_after;
};

namespace {

/// One side of a move seen on the joint mesh: its spec there (null without a joint mesh), and
/// which dims of its own mesh keep their placement (the others are gathered on the trainer's
/// side, cut locally on the generator's).
struct JointSide {
  std::unique_ptr<PlacementSpec> spec;
  std::vector<bool> keep;
};

JointSide side_on_joint(const DeviceMesh& mesh, const PlacementSpec& spec, const JointMesh* joint,
                        bool first, const Shape& shape) {
  JointSide side{nullptr,
                 std::vector<bool>(static_cast<std::size_t>(mesh.ndim()), joint != nullptr)};
  if (joint == nullptr) return side;
  const auto& runs = first ? joint->first_runs : joint->second_runs;
  side.spec = spec_on_joint(mesh, spec, *joint, runs, shape);
  if (side.spec != nullptr) return side;
  for (std::size_t d = 0; d < side.keep.size(); ++d)
    side.keep[d] = runs[d].size() <= 1;
  side.spec = spec_on_joint(mesh, replicated_except(spec, side.keep), *joint, runs, shape);
  return side;
}

/// `spec` with a leading Replicate dim (the copies of the trainer's layout).
PlacementSpec with_copies_dim(const PlacementSpec& spec) {
  std::vector<Placement> placements = spec.placements();
  std::vector<int> levels = spec.shard_levels();
  placements.insert(placements.begin(), Placement::replicate());
  levels.insert(levels.begin(), 0);
  return PlacementSpec(placements, levels);
}

std::unique_ptr<comm::MeshGroups> groups_on(const DeviceMesh& mesh, comm::Communicator& world) {
  return std::make_unique<comm::MeshGroups>(
      mesh, std::shared_ptr<comm::Communicator>(&world, [](comm::Communicator*) {}));
}

}  // namespace

WeightSync::WeightSync(train::TrainingModel& trainer, std::int64_t trainer_copies,
                       comm::MeshGroups& generator_groups,
                       std::vector<nn::Parameter*> generator_parameters, comm::ReductionMode mode)
    : copies_(trainer_copies > 1), generator_groups_(generator_groups), mode_(mode) {
  // The trainer's mesh on the world: with copies, a leading dim over them (replicated).
  const DeviceMesh& own_mesh = trainer.layout().mesh;
  std::vector<std::int64_t> sizes = own_mesh.sizes();
  if (copies_) sizes.insert(sizes.begin(), trainer_copies);
  const DeviceMesh train_mesh(sizes);
  source_groups_ = groups_on(train_mesh, generator_groups.world());
  const std::unique_ptr<JointMesh> joint = joint_mesh(train_mesh, generator_groups.mesh());
  if (joint != nullptr) joint_groups_ = groups_on(joint->mesh, generator_groups.world());
  std::vector<train::TrainingModel::PlacedParameter> sources = trainer.placed_parameters();
  if (sources.size() != generator_parameters.size()) {
    throw InvalidArgument(fmt::format("the trainer has {} parameters, the generator {}",
                                      sources.size(), generator_parameters.size()));
  }
  std::vector<std::int64_t> received(static_cast<std::size_t>(train_mesh.size()), 0);
  for (std::size_t i = 0; i < sources.size(); ++i) {
    if (copies_) {
      sources[i].spec = with_copies_dim(sources[i].spec);
      for (std::int64_t r = own_mesh.size(); r < train_mesh.size(); ++r)
        received[static_cast<std::size_t>(r)] +=
            local_layout(train_mesh, sources[i].spec, sources[i].global_shape, r).numel() * 4;
    }
    moves_.push_back(plan_move(std::move(sources[i]), generator_parameters[i], train_mesh,
                               joint.get(), received));
  }
  collectives_ = copies_ ? 1 : 0;  // the broadcast to the copies, one for all shards
  for (const auto stage : {&Move::gather_first, &Move::joint, &Move::cut_after}) {
    std::vector<const plan::Plan*> plans;
    for (const Move& move : moves_)
      if (move.*stage != nullptr) plans.push_back((move.*stage).get());
    collectives_ += dtensor::batch_collectives(plans);
  }
  bytes_per_rank_ = *std::max_element(received.begin(), received.end());
}

WeightSync::Move WeightSync::plan_move(train::TrainingModel::PlacedParameter source,
                                       nn::Parameter* target, const DeviceMesh& train_mesh,
                                       const JointMesh* joint,
                                       std::vector<std::int64_t>& received) const {
  const Shape shape = source.global_shape;
  if (source.parameter->name != target->name || target->global_shape() != shape) {
    throw InvalidArgument(fmt::format("trainer parameter {} {} has no generator twin (found {} {})",
                                      source.parameter->name, shape.to_string(), target->name,
                                      target->global_shape().to_string()));
  }
  const DeviceMesh& generator_mesh = generator_groups_.mesh();
  const PlacementSpec want = generator_spec(*target);
  const JointSide from = side_on_joint(train_mesh, source.spec, joint, true, shape);
  const JointSide to = side_on_joint(generator_mesh, want, joint, false, shape);
  dtensor::RedistributeOptions options;
  options.mode = mode_;
  Move move{std::move(source), target, nullptr, nullptr, nullptr};
  const PlacementSpec gathered = replicated_except(move.source.spec, from.keep);
  if (!(gathered == move.source.spec)) {
    move.gather_first =
        dtensor::plan_for(train_mesh, move.source.spec, gathered, shape, DType::f32, options);
    add_received(*move.gather_first, received);
  }
  if (from.spec != nullptr && to.spec != nullptr) {
    move.joint = dtensor::plan_for(joint->mesh, *from.spec, *to.spec, shape, DType::f32, options);
    add_received(*move.joint, received);
  }
  const PlacementSpec cut = replicated_except(want, to.keep);
  if (!(cut == want))
    move.cut_after = dtensor::plan_for(generator_mesh, cut, want, shape, DType::f32, options);
  return move;
}

WeightSync::~WeightSync() = default;

bool WeightSync::joint() const {
  return joint_groups_ != nullptr;
}

SyncStats WeightSync::run() {
  const auto start = Clock::now();
  dtensor::RedistributeOptions options;
  options.mode = mode_;
  std::vector<Tensor> values;
  for (const Move& move : moves_)
    values.push_back(move.source.local);
  if (copies_) broadcast_to_copies(values);
  // Each stage runs every parameter's plan of that stage together (one collective per step
  // shape for all of them).
  run_stage(&Move::gather_first, *source_groups_, values, options);
  if (joint_groups_ != nullptr) run_stage(&Move::joint, *joint_groups_, values, options);
  run_stage(&Move::cut_after, generator_groups_, values, options);
  for (std::size_t i = 0; i < moves_.size(); ++i)
    moves_[i].target->value.copy_from(values[i]);
  return {std::chrono::duration<double>(Clock::now() - start).count(), collectives_,
          bytes_per_rank_};
}

void WeightSync::run_stage(std::shared_ptr<const plan::Plan> Move::*stage, comm::MeshGroups& groups,
                           std::vector<Tensor>& values,
                           const dtensor::RedistributeOptions& options) {
  std::vector<const plan::Plan*> plans;
  std::vector<Tensor> inputs;
  std::vector<std::size_t> which;
  for (std::size_t i = 0; i < moves_.size(); ++i) {
    if (moves_[i].*stage == nullptr) continue;
    plans.push_back((moves_[i].*stage).get());
    inputs.push_back(values[i]);
    which.push_back(i);
  }
  if (plans.empty()) return;
  std::vector<Tensor> outputs = dtensor::execute_plans(plans, groups, inputs, options);
  for (std::size_t k = 0; k < which.size(); ++k)
    values[which[k]] = std::move(outputs[k]);
}

/// The copies of the trainer's layout take the training ranks' shards: one broadcast of every
/// shard back to back over the copies' dim.
void WeightSync::broadcast_to_copies(std::vector<Tensor>& values) {
  std::int64_t count = 0;
  for (const Tensor& v : values)
    count += v.numel();
  Tensor all({count}, DType::f32);
  std::int64_t at = 0;
  for (const Tensor& v : values) {
    if (v.numel() > 0) all.narrow(0, at, v.numel()).copy_from(v.contiguous().flatten());
    at += v.numel();
  }
  source_groups_->group(std::vector<int>{0})->broadcast(all, 0);
  at = 0;
  for (Tensor& v : values) {
    // The copies' shards are views of their flat buffers: they hold the synced values after.
    if (v.numel() > 0) v.copy_from(all.narrow(0, at, v.numel()).reshape(v.shape()));
    at += v.numel();
  }
}

SyncStats naive_weight_sync(train::TrainingModel& trainer, const DeviceMesh& generator_mesh,
                            std::vector<nn::Parameter*> generator_parameters) {
  const auto start = Clock::now();
  comm::Communicator& world = trainer.groups().world();
  const DeviceMesh& mesh = trainer.layout().mesh;
  if (mesh.size() != generator_mesh.size()) {
    throw InvalidArgument(
        fmt::format("the naive sync needs the trainer ({} ranks) on the "
                    "generator's {} ranks",
                    mesh.size(), generator_mesh.size()));
  }
  const auto ranks = static_cast<std::size_t>(world.size());
  const std::int64_t rank = world.rank();
  SyncStats stats;
  std::vector<train::TrainingModel::PlacedParameter> sources = trainer.placed_parameters();
  for (std::size_t i = 0; i < sources.size(); ++i) {
    const auto& source = sources[i];
    const Shape& shape = source.global_shape;
    // Of the ranks holding the same block, the one at coordinate 0 on every non-shard dim sends.
    std::vector<Layout> blocks;
    std::vector<std::int64_t> send(ranks, 0);
    std::vector<std::int64_t> recv(ranks, 0);
    for (std::size_t r = 0; r < ranks; ++r) {
      blocks.push_back(local_layout(mesh, source.spec, shape, static_cast<std::int64_t>(r)));
      const std::vector<std::int64_t> at = mesh.coordinates(static_cast<std::int64_t>(r));
      bool sender = true;
      for (const int d : non_shard_mesh_dims(source.spec))
        sender = sender && at[static_cast<std::size_t>(d)] == 0;
      if (!sender) continue;
      if (static_cast<std::int64_t>(r) == rank) send[0] = blocks.back().numel();
      if (rank == 0) recv[r] = blocks.back().numel();
    }
    std::int64_t incoming = 0;
    for (const std::int64_t count : recv)
      incoming += count;
    Tensor gathered(Shape{incoming}, DType::f32);
    const Tensor mine = send[0] > 0 ? source.local.contiguous().reshape(Shape{send[0]})
                                    : Tensor(Shape{0}, DType::f32);
    world.all_to_all(mine, gathered, send, recv);
    Tensor whole = Tensor::zeros(shape, DType::f32);
    if (rank == 0) {
      std::int64_t at = 0;
      for (std::size_t r = 0; r < ranks; ++r) {
        if (recv[r] == 0) continue;
        local_view(whole, blocks[r])
            .copy_from(gathered.narrow(0, at, recv[r]).reshape(blocks[r].local_shape));
        at += recv[r];
      }
    }
    world.broadcast(whole, 0);
    nn::Parameter& target = *generator_parameters[i];
    target.value.copy_from(
        local_view(whole, local_layout(generator_mesh, generator_spec(target), shape, rank)));
    stats.collectives += 2;
    stats.bytes_per_rank += shape.numel() * 4;
  }
  stats.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return stats;
}

}  // namespace meshtensor::rl
