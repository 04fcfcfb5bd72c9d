#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <meshtensor/comm/communicator.hpp>
#include <meshtensor/comm/mesh_groups.hpp>
#include <meshtensor/dtensor/redistribute.hpp>
#include <meshtensor/mesh/device_mesh.hpp>
#include <meshtensor/mesh/spec.hpp>
#include <meshtensor/nn/module.hpp>
#include <meshtensor/plan/plan.hpp>
#include <meshtensor/train/training_model.hpp>

namespace meshtensor::rl {

/// The generator's layout: `replicas` copies of the model, each split over `tp` ranks, on the
/// world's ranks in order (mesh replicas x tp, rank = replica * tp + tp rank), colocated with the
/// trainer.
struct GeneratorLayout {
  std::int64_t replicas = 1;
  std::int64_t tp = 1;
  /// replicas * tp.
  std::int64_t ranks() const { return replicas * tp; }
  /// The mesh: {replicas, tp} named dp, tp.
  DeviceMesh mesh() const;
  /// E.g. "2x2 (dp x tp)".
  std::string describe() const;
};

/// One mesh whose dims refine two meshes over the same ranks in row-major order: each dim of
/// either mesh is a run of consecutive dims of it (its `runs`). Exists when the two meshes'
/// strides nest (every stride of one divides or is divided by the other's neighbours); for
/// example 1x4x1 (dp, fsdp, tp) and 2x2 (dp, tp) refine to 2x2, while 2x3 and 3x2 do not.
struct JointMesh {
  DeviceMesh mesh;
  std::vector<std::vector<int>> first_runs;   ///< per dim of the first mesh: its joint dims
  std::vector<std::vector<int>> second_runs;  ///< per dim of the second mesh
};

/// The joint mesh of `first` and `second` (same rank count), or nullptr when their strides do
/// not nest.
std::unique_ptr<JointMesh> joint_mesh(const DeviceMesh& first, const DeviceMesh& second);

/// `spec` (on the mesh whose dims map to `runs` of `joint`) as a spec on the joint mesh, when every
/// rank's block of a tensor of `shape` is the same under both; nullptr otherwise (a dim sharded
/// over several joint dims with chunks that do not nest, e.g. 5 rows over 4 ranks as 2x2).
std::unique_ptr<PlacementSpec> spec_on_joint(const DeviceMesh& mesh, const PlacementSpec& spec,
                                             const JointMesh& joint,
                                             const std::vector<std::vector<int>>& runs,
                                             const Shape& shape);

/// Figures of one weight sync, the same on every rank.
struct SyncStats {
  double seconds = 0;               ///< wall time on this rank
  std::int64_t collectives = 0;     ///< collectives run (per rank)
  std::int64_t bytes_per_rank = 0;  ///< the most bytes any rank receives
};

/// Moves a trainer's parameters to a generator's in memory: each parameter goes from its
/// training placement (FSDP shards of tensor-parallel blocks on the trainer's mesh) to the
/// generator's (its tp blocks, replicated over its replicas) by redistribute. Both layouts are
/// seen on their joint mesh, so one planned redistribute (fused collectives) moves each
/// parameter; a dim whose chunks do not nest there is first gathered on its own mesh (trainer)
/// or cut locally afterwards (generator). Every plan is made once, at construction.
class WeightSync {
 public:
  /// The sync from `trainer` to `generator_parameters` (the generator model's parameters, the
  /// same names as the trainer's, split by tp::decoder_plan over the tp dim of
  /// `generator_groups`' mesh, a GeneratorLayout mesh over the whole world). When the trainer
  /// runs on fewer ranks than the world, the world holds `trainer_copies` copies of its layout
  /// (ranks [0, T) train, [T, 2T) ... hold a copy built alike): each sync first broadcasts the
  /// trained shards to the copies, then every rank takes part as a trainer rank. Collective over
  /// the world (makes groups).
  WeightSync(train::TrainingModel& trainer, std::int64_t trainer_copies,
             comm::MeshGroups& generator_groups, std::vector<nn::Parameter*> generator_parameters,
             comm::ReductionMode mode);
  ~WeightSync();
  WeightSync(const WeightSync&) = delete;
  WeightSync& operator=(const WeightSync&) = delete;

  /// Copies the trainer's current parameters into the generator's. Collective.
  SyncStats run();
  /// Whether the two layouts have a joint mesh (otherwise every parameter goes through its whole
  /// value on every rank).
  bool joint() const;

 private:
  struct Move;
  Move plan_move(train::TrainingModel::PlacedParameter source, nn::Parameter* target,
                 const DeviceMesh& train_mesh, const JointMesh* joint,
                 std::vector<std::int64_t>& received) const;
  void run_stage(std::shared_ptr<const plan::Plan> Move::*stage, comm::MeshGroups& groups,
                 std::vector<Tensor>& values, const dtensor::RedistributeOptions& options);
  void broadcast_to_copies(std::vector<Tensor>& values);
  std::unique_ptr<comm::MeshGroups> source_groups_;  // the trainer's mesh (and copies) on the world
  bool copies_ = false;
  comm::MeshGroups& generator_groups_;
  std::unique_ptr<comm::MeshGroups> joint_groups_;
  std::vector<Move> moves_;
  std::int64_t collectives_ = 0;
  std::int64_t bytes_per_rank_ = 0;
  comm::ReductionMode mode_;
};

/// The baseline a sync is measured against: every parameter's blocks gathered whole on world
/// rank 0 (an all_to_all that sends only to it), broadcast from there to every rank, and each
/// generator rank cutting its block. Collective; the same result as WeightSync::run() (the
/// trainer on every rank of the world).
SyncStats naive_weight_sync(train::TrainingModel& trainer, const DeviceMesh& generator_mesh,
                            std::vector<nn::Parameter*> generator_parameters);

}  // namespace meshtensor::rl
