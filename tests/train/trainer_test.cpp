#include <vector>

#include <gtest/gtest.h>

#include <meshtensor/comm/threads_backend.hpp>
#include <meshtensor/core/random.hpp>
#include <meshtensor/train/trainer.hpp>

#include "support/train_on_threads.hpp"

namespace meshtensor::train {
namespace {

/// A small learnable problem: the label is the brightest of 10 pixel groups, plus noise.
Dataset synthetic(std::int64_t train_count, std::int64_t test_count) {
  const auto make = [](std::int64_t count, std::uint64_t seed) {
    ImageSet set{count, 4, 5, std::vector<std::uint8_t>(static_cast<std::size_t>(count * 20)),
                 std::vector<std::uint8_t>(static_cast<std::size_t>(count))};
    for (std::int64_t i = 0; i < count; ++i) {
      const auto label =
          static_cast<std::uint8_t>(uniform_int_sample(seed, static_cast<std::uint64_t>(i), 0, 9));
      set.labels[static_cast<std::size_t>(i)] = label;
      for (std::int64_t f = 0; f < 20; ++f) {
        const std::int64_t noise =
            uniform_int_sample(seed + 1, static_cast<std::uint64_t>(i * 20 + f), 0, 120);
        set.pixels[static_cast<std::size_t>(i * 20 + f)] =
            static_cast<std::uint8_t>(noise + (f / 2 == label ? 120 : 0));
      }
    }
    return set;
  };
  return {make(train_count, 1), make(test_count, 2)};
}

/// The MLP the tests train: small, with every layer kind.
nn::MlpConfig small_mlp() {
  nn::MlpConfig model;
  model.hidden = {24, 16};
  model.layernorm = true;
  model.activation = nn::Activation::gelu;
  return model;
}

TrainResult run(const Dataset& data, const TrainConfig& config, int ranks,
                const nn::MlpConfig& model = small_mlp()) {
  return testing::train_on_threads(ImageClassification(data, model), config, ranks);
}

TrainConfig small_config(comm::ReductionMode mode) {
  TrainConfig config;
  config.steps = 9;
  config.batch = 37;  // uneven over every rank count below
  config.mode = mode;
  config.schedule.base = 3e-3;
  config.schedule.warmup_steps = 2;
  config.schedule.kind = nn::LrSchedule::Kind::cosine;
  config.weight_decay = 0.01;
  config.seed = 11;
  return config;
}

TEST(Train, ExactWeightsAreTheSameBitsOnEveryLayoutAndMicroBatchSplit) {
  const Dataset data = synthetic(150, 50);  // the epoch ends in a partial batch
  const TrainConfig base = small_config(comm::ReductionMode::exact);
  const TrainResult reference = run(data, base, 1);
  EXPECT_TRUE(reference.replicas_identical);
  for (const auto& [ranks, micro] : {std::pair{2, 1}, std::pair{3, 2}, std::pair{4, 1},
                                     std::pair{8, 1}, std::pair{1, 5}, std::pair{3, 37}}) {
    TrainConfig config = base;
    config.micro_batches = micro;
    const TrainResult result = run(data, config, ranks);
    EXPECT_EQ(result.digest, reference.digest) << ranks << " ranks, " << micro << " micro-batches";
    EXPECT_TRUE(result.replicas_identical);
    EXPECT_EQ(result.epochs.back().train_loss, reference.epochs.back().train_loss);
  }
  TrainConfig sgd = base;
  sgd.optimizer = OptimizerKind::sgd;
  EXPECT_EQ(run(data, sgd, 2).digest, run(data, sgd, 3).digest);
}

TEST(Train, ExactWeightsAreTheSameBitsForDdpFsdpHsdpAndBothMicroBatchModes) {
  const Dataset data = synthetic(150, 50);
  const TrainConfig base = small_config(comm::ReductionMode::exact);
  const TrainResult reference = run(data, base, 1);
  struct Case {
    Strategy strategy;
    int ranks;
    std::int64_t replicas;
    std::int64_t micro;
    MicroBatchMode micro_mode;
  };
  for (const Case& c : {Case{Strategy::ddp, 8, 0, 1, MicroBatchMode::no_sync},
                        Case{Strategy::fsdp, 8, 0, 1, MicroBatchMode::no_sync},
                        Case{Strategy::fsdp, 3, 0, 2, MicroBatchMode::reduce_scatter},
                        Case{Strategy::hsdp, 8, 2, 1, MicroBatchMode::no_sync},
                        Case{Strategy::hsdp, 8, 4, 4, MicroBatchMode::no_sync},
                        Case{Strategy::hsdp, 8, 4, 4, MicroBatchMode::reduce_scatter},
                        Case{Strategy::hsdp, 6, 3, 3, MicroBatchMode::reduce_scatter}}) {
    TrainConfig config = base;
    config.strategy = c.strategy;
    config.replicas = c.replicas;
    config.micro_batches = c.micro;
    config.micro_batch_mode = c.micro_mode;
    const TrainResult result = run(data, config, c.ranks);
    EXPECT_EQ(result.digest, reference.digest)
        << result.mesh << ", " << c.micro << " micro-batches, mode "
        << static_cast<int>(c.micro_mode);
    EXPECT_TRUE(result.replicas_identical);
  }
}

TEST(Train, OrderedFsdpEqualsDdpBitwiseAndHsdpReplicasAgree) {
  const Dataset data = synthetic(150, 50);
  TrainConfig config = small_config(comm::ReductionMode::ordered);
  config.strategy = Strategy::ddp;
  const TrainResult ddp = run(data, config, 4);
  config.strategy = Strategy::fsdp;
  const TrainResult fsdp = run(data, config, 4);
  // Both sum each element over the ranks in rank order, then divide once.
  EXPECT_EQ(ddp.digest, fsdp.digest);
  config.strategy = Strategy::hsdp;
  config.replicas = 2;
  const TrainResult hsdp = run(data, config, 4);
  EXPECT_TRUE(hsdp.replicas_identical);
  EXPECT_TRUE(fsdp.replicas_identical);
  // Sharded state is a quarter of DDP's (parameters, gradients, optimizer state).
  const auto state = [](const TrainResult& r) {
    return r.memory_peak_by_kind.of(fsdp::MemoryKind::parameters) +
           r.memory_peak_by_kind.of(fsdp::MemoryKind::gradients) +
           r.memory_peak_by_kind.of(fsdp::MemoryKind::optimizer_state);
  };
  EXPECT_LE(state(fsdp), state(ddp) / 4 + 4096);
  EXPECT_LT(fsdp.memory_peak.total(), ddp.memory_peak.total());
}

TEST(Train, OrderedReplicasAreIdenticalAndARerunRepeatsThem) {
  const Dataset data = synthetic(150, 50);
  const TrainConfig config = small_config(comm::ReductionMode::ordered);
  const TrainResult first = run(data, config, 3);
  EXPECT_TRUE(first.replicas_identical);
  EXPECT_EQ(run(data, config, 3).digest, first.digest);
}

TEST(Train, TheSeedSetsTheInitialWeights) {
  const Dataset data = synthetic(40, 10);
  TrainConfig config = small_config(comm::ReductionMode::exact);
  config.steps = 1;
  config.schedule.base = 0.0;  // weights stay as initialised
  config.weight_decay = 0.0;
  const auto digest_for_seed = [&](std::uint64_t seed) {
    config.seed = seed;
    return run(data, config, 1).digest;
  };
  nn::MlpConfig model = small_mlp();
  model.inputs = 20;
  model.outputs = kClasses;
  model.seed = 5;
  EXPECT_EQ(digest_for_seed(5), nn::parameters_digest(nn::make_mlp(model)->parameters()));
  EXPECT_NE(digest_for_seed(6), digest_for_seed(5));
}

TEST(Train, LearnsTheSyntheticProblem) {
  const Dataset data = synthetic(2000, 500);
  TrainConfig config = small_config(comm::ReductionMode::ordered);
  config.steps = 0;
  config.epochs = 3;
  config.batch = 50;
  const TrainResult result = run(data, config, 2);
  ASSERT_EQ(result.epochs.size(), 3u);
  EXPECT_GT(result.test_accuracy, 0.8);
  EXPECT_LT(result.epochs.back().train_loss, result.epochs.front().train_loss);
}

TEST(Train, RejectsBadSettings) {
  const Dataset data = synthetic(10, 5);
  TrainConfig config = small_config(comm::ReductionMode::ordered);
  config.batch = 0;
  EXPECT_THROW(run(data, config, 1), InvalidArgument);
  config = small_config(comm::ReductionMode::ordered);
  config.micro_batches = 0;
  EXPECT_THROW(run(data, config, 1), InvalidArgument);
}

}  // namespace
}  // namespace meshtensor::train
