#include <atomic>
#include <mutex>

#include <gtest/gtest.h>

#include <meshtensor/comm/threads_backend.hpp>
#include <meshtensor/core/error.hpp>
#include <meshtensor/mesh/layout.hpp>
#include <meshtensor/nn/gpt.hpp>
#include <meshtensor/rl/rewards.hpp>
#include <meshtensor/rl/weight_sync.hpp>
#include <meshtensor/tp/style.hpp>
#include <meshtensor/train/training_model.hpp>

#include "support/tiny_gpt.hpp"

namespace meshtensor::rl {
namespace {

TEST(JointMesh, RefinesMeshesWhoseStridesNest) {
  const auto joint = joint_mesh(DeviceMesh({1, 4, 1}), DeviceMesh({2, 2}));
  ASSERT_NE(joint, nullptr);
  EXPECT_EQ(joint->mesh.sizes(), (std::vector<std::int64_t>{2, 2}));
  EXPECT_EQ(joint->first_runs, (std::vector<std::vector<int>>{{}, {0, 1}, {}}));
  EXPECT_EQ(joint->second_runs, (std::vector<std::vector<int>>{{0}, {1}}));
  const auto three = joint_mesh(DeviceMesh({2, 2, 2}), DeviceMesh({4, 2}));
  ASSERT_NE(three, nullptr);
  EXPECT_EQ(three->mesh.sizes(), (std::vector<std::int64_t>{2, 2, 2}));
  EXPECT_EQ(three->second_runs, (std::vector<std::vector<int>>{{0, 1}, {2}}));
}

TEST(JointMesh, NoneWhenStridesCross) {
  EXPECT_EQ(joint_mesh(DeviceMesh({2, 3}), DeviceMesh({3, 2})), nullptr);
  EXPECT_THROW(joint_mesh(DeviceMesh({4}), DeviceMesh({3})), InvalidArgument);
}

TEST(JointMesh, SpecOnlyWhereChunksNest) {
  const auto joint = joint_mesh(DeviceMesh({4}), DeviceMesh({2, 2}));
  ASSERT_NE(joint, nullptr);
  const PlacementSpec shard(std::vector<Placement>{Placement::shard(0)});
  // 8 rows: 2 per rank either way; 5 rows: torch.chunk gives 2,2,1,0 but 3,2 then 2,1,1,1.
  EXPECT_NE(spec_on_joint(DeviceMesh({4}), shard, *joint, joint->first_runs, Shape{8, 3}), nullptr);
  EXPECT_EQ(spec_on_joint(DeviceMesh({4}), shard, *joint, joint->first_runs, Shape{5, 3}), nullptr);
}

nn::GptConfig small_gpt(std::int64_t heads = 4) {
  // 10 position rows: uneven over 4 ranks, and not nested as 2x2.
  return testing::tiny_gpt(
      {.heads = heads, .dim = 4 * heads, .context = 10, .seed = 5, .init_std = 0.2});
}

struct Layouts {
  train::TrainConfig trainer;
  GeneratorLayout generator;
};

/// After a sync every generator block holds the trainer's whole parameter's block.
/// Returns the collectives the sync ran.
std::int64_t expect_sync_is_exact(const Layouts& layouts, bool naive, std::int64_t heads = 4) {
  std::atomic<std::int64_t> collectives{0};
  const RlTask task = arithmetic_task();
  const train::LanguageModelling language(task.corpus, small_gpt(heads));
  const int ranks = static_cast<int>(layouts.generator.ranks());
  comm::run_threads(ranks, [&](comm::Communicator& world) {
    train::TrainingModel trainer(world, language, layouts.trainer, 11);
    comm::MeshGroups generator_groups(
        layouts.generator.mesh(),
        std::shared_ptr<comm::Communicator>(&world, [](comm::Communicator*) {}));
    nn::Gpt generator(small_gpt(heads));
    tp::TensorParallel tp(generator_groups.group(std::vector<int>{1}), comm::ReductionMode::exact,
                          false);
    if (tp.size() > 1)
      tp::parallelize_module(generator, tp, tp::decoder_plan(generator.spec(), false));
    const SyncStats stats =
        naive ? naive_weight_sync(trainer, layouts.generator.mesh(), generator.parameters())
              : WeightSync(trainer, 1, generator_groups, generator.parameters(),
                           comm::ReductionMode::exact)
                    .run();
    if (world.rank() == 0) collectives = stats.collectives;
    const std::vector<Tensor> whole = trainer.whole_parameters();
    const std::vector<nn::Parameter*> mine = generator.parameters();
    for (std::size_t i = 0; i < mine.size(); ++i) {
      const nn::Parameter& p = *mine[i];
      Layout block;
      block.local_shape = p.value.shape();
      block.global_offset = p.split.offset.empty()
                                ? std::vector<std::int64_t>(p.value.shape().rank(), 0)
                                : p.split.offset;
      const Tensor expected = local_view(whole[i], block).contiguous();
      EXPECT_EQ(expected.digest(), p.value.digest())
          << p.name << " on rank " << world.rank() << " (" << layouts.generator.describe() << ")";
    }
  });
  return collectives;
}

train::TrainConfig trainer_on(const std::string& shape, const std::string& names,
                              bool sequence_parallel = false) {
  train::TrainConfig config;
  config.mode = comm::ReductionMode::exact;
  if (!shape.empty()) config.mesh = train::parse_named_mesh(shape, names);
  config.sequence_parallel = sequence_parallel;
  return config;
}

TEST(WeightSync, EveryTrainerLayoutToEveryGeneratorLayout) {
  train::TrainConfig fsdp4;
  fsdp4.strategy = train::Strategy::fsdp;
  train::TrainConfig ddp4;
  train::TrainConfig hsdp;
  hsdp.strategy = train::Strategy::hsdp;
  const std::vector<train::TrainConfig> trainers{fsdp4,
                                                 ddp4,
                                                 hsdp,
                                                 trainer_on("2x2", "fsdp,tp", true),
                                                 trainer_on("4", "tp"),
                                                 trainer_on("2x2", "tp,dp"),
                                                 trainer_on("1x4", "dp,fsdp")};
  for (const auto& trainer : trainers) {
    for (const GeneratorLayout generator :
         {GeneratorLayout{4, 1}, GeneratorLayout{2, 2}, GeneratorLayout{1, 4}}) {
      SCOPED_TRACE(generator.describe());
      expect_sync_is_exact({trainer, generator}, false);
    }
  }
  // Layouts that already agree move nothing: DDP to replicas, tp 4 to tp 4.
  train::TrainConfig ddp;
  EXPECT_EQ(expect_sync_is_exact({ddp, GeneratorLayout{4, 1}}, false), 0);
  EXPECT_EQ(expect_sync_is_exact({trainer_on("4", "tp"), GeneratorLayout{1, 4}}, false), 0);
  train::TrainConfig fsdp;
  fsdp.strategy = train::Strategy::fsdp;
  EXPECT_GT(expect_sync_is_exact({fsdp, GeneratorLayout{2, 2}}, false), 0);
}

TEST(WeightSync, NaiveBaselineMovesTheSameBits) {
  train::TrainConfig fsdp4;
  fsdp4.strategy = train::Strategy::fsdp;
  expect_sync_is_exact({fsdp4, GeneratorLayout{2, 2}}, true);
  expect_sync_is_exact({trainer_on("2x2", "fsdp,tp", true), GeneratorLayout{1, 4}}, true);
}

TEST(WeightSync, LayoutsWithoutAJointMesh) {
  // 2x3 (dp x tp) on 6 ranks and the trainer's 3x2 (fsdp x tp) share no joint mesh.
  EXPECT_EQ(joint_mesh(DeviceMesh({3, 2}), DeviceMesh({2, 3})), nullptr);
  expect_sync_is_exact({trainer_on("3x2", "fsdp,tp"), GeneratorLayout{2, 3}}, false, 6);
}

}  // namespace
}  // namespace meshtensor::rl
