// Pipeline schedules (pure), point-to-point links, a pipeline run on a threads world, the
// activation stash and activation checkpointing.
#include <map>
#include <memory>
#include <set>
#include <vector>

#include <gtest/gtest.h>

#include <meshtensor/comm/peer.hpp>
#include <meshtensor/comm/threads_backend.hpp>
#include <meshtensor/core/error.hpp>
#include <meshtensor/nn/gpt.hpp>
#include <meshtensor/nn/gradients.hpp>
#include <meshtensor/pp/pipeline.hpp>
#include <meshtensor/pp/schedule.hpp>
#include <meshtensor/pp/stage.hpp>

#include "support/tiny_gpt.hpp"

namespace meshtensor::pp {
namespace {

using Kind = PipelineAction::Kind;

std::vector<ScheduleConfig> every_schedule() {
  std::vector<ScheduleConfig> all;
  for (std::int64_t p = 1; p <= 4; ++p) {
    for (std::int64_t m = p; m <= 3 * p + 1; ++m) {
      all.push_back({ScheduleKind::gpipe, p, 1, m});
      all.push_back({ScheduleKind::one_f_one_b, p, 1, m});
      if (m % p == 0) {
        all.push_back({ScheduleKind::interleaved_1f1b, p, 2, m});
        all.push_back({ScheduleKind::interleaved_1f1b, p, 3, m});
      }
    }
  }
  return all;
}

std::string describe(const ScheduleConfig& c) {
  return schedule_name(c.kind) + " p=" + std::to_string(c.ranks) +
         " v=" + std::to_string(c.virtual_stages) + " m=" + std::to_string(c.micro_batches);
}

TEST(PipelineSchedule, EveryStageRunsEachMicroBatchOnceInOrder) {
  for (const ScheduleConfig& config : every_schedule()) {
    SCOPED_TRACE(describe(config));
    const auto schedule = build_schedule(config);
    ASSERT_EQ(static_cast<std::int64_t>(schedule.size()), config.ranks);
    for (std::int64_t r = 0; r < config.ranks; ++r) {
      std::map<std::pair<int, std::int64_t>, std::vector<std::int64_t>> order;  // (kind, chunk)
      for (const PipelineAction& a : schedule[static_cast<std::size_t>(r)])
        order[{static_cast<int>(a.kind), a.chunk}].push_back(a.micro_batch);
      ASSERT_EQ(static_cast<std::int64_t>(order.size()), 2 * config.virtual_stages);
      for (const auto& [key, micro_batches] : order) {
        std::vector<std::int64_t> expected(static_cast<std::size_t>(config.micro_batches));
        for (std::size_t i = 0; i < expected.size(); ++i)
          expected[i] = static_cast<std::int64_t>(i);
        EXPECT_EQ(micro_batches, expected);
      }
    }
  }
}

TEST(PipelineSchedule, ReplayNeverDeadlocksAndMeetsTheBubbleTheory) {
  for (const ScheduleConfig& config : every_schedule()) {
    SCOPED_TRACE(describe(config));
    const ScheduleReplay replay = replay_schedule(config, build_schedule(config));
    const double theory = theoretical_bubble(config);
    if (config.kind == ScheduleKind::interleaved_1f1b) {
      // Chunks of 1/v of the work each: the replay's units are per chunk.
      const ScheduleReplay scaled = replay_schedule(
          config, build_schedule(config), 1.0 / static_cast<double>(config.virtual_stages),
          2.0 / static_cast<double>(config.virtual_stages));
      EXPECT_LE(scaled.bubble, theory + 1e-9);
    } else {
      EXPECT_NEAR(replay.bubble, theory, 1e-9);
    }
  }
}

TEST(PipelineSchedule, OneFOneBHoldsAtMostAsManyMicroBatchesAsRanks) {
  for (std::int64_t p = 1; p <= 4; ++p) {
    const ScheduleConfig one_f_one_b{ScheduleKind::one_f_one_b, p, 1, 4 * p};
    EXPECT_EQ(replay_schedule(one_f_one_b, build_schedule(one_f_one_b)).peak_in_flight, p);
    const ScheduleConfig gpipe{ScheduleKind::gpipe, p, 1, 4 * p};
    EXPECT_EQ(replay_schedule(gpipe, build_schedule(gpipe)).peak_in_flight, 4 * p);
  }
}

TEST(PipelineSchedule, RefusesShapesItCannotRun) {
  EXPECT_THROW(check_schedule({ScheduleKind::one_f_one_b, 0, 1, 4}), InvalidArgument);
  EXPECT_THROW(check_schedule({ScheduleKind::one_f_one_b, 2, 2, 4}), InvalidArgument);
  EXPECT_THROW(check_schedule({ScheduleKind::interleaved_1f1b, 2, 1, 4}), InvalidArgument);
  try {
    check_schedule({ScheduleKind::interleaved_1f1b, 4, 2, 6});
    FAIL() << "6 micro-batches on 4 ranks";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("6 micro-batches is not a multiple of the 4"),
              std::string::npos);
  }
  EXPECT_THROW(parse_schedule("zero-bubble"), ParseError);
  EXPECT_EQ(parse_schedule("interleaved-1f1b"), ScheduleKind::interleaved_1f1b);
}

TEST(PipelineStages, SplitBlocksEvenlyEarlierStagesFirst) {
  const auto split = split_blocks(7, 3);
  ASSERT_EQ(split.size(), 3U);
  EXPECT_EQ(split[0], (std::pair<std::int64_t, std::int64_t>{0, 3}));
  EXPECT_EQ(split[1], (std::pair<std::int64_t, std::int64_t>{3, 5}));
  EXPECT_EQ(split[2], (std::pair<std::int64_t, std::int64_t>{5, 7}));
  EXPECT_THROW(split_blocks(4, 5), InvalidArgument);
}

TEST(PeerChannels, SendsAndReceivesAroundARingInOrder) {
  comm::run_threads(3, [](comm::Communicator& world) {
    const int me = world.rank();
    const int next = (me + 1) % 3;
    const int previous = (me + 2) % 3;
    comm::PeerChannels links(world, {{0, 1, 0}, {1, 2, 0}, {2, 0, 0}});
    std::vector<comm::Work> sends;
    for (int i = 0; i < 3; ++i)
      sends.push_back(links.isend(Tensor::full(Shape{4}, DType::f32, 10.0 * me + i), next, 0));
    for (int i = 0; i < 3; ++i) {
      Tensor got(Shape{4}, DType::f32);
      links.recv(got, previous, 0);
      EXPECT_EQ(got.values<float>()[3], static_cast<float>(10 * previous + i));
    }
    for (const comm::Work& w : sends)
      w.wait();
  });
}

TEST(PeerChannels, BatchedSendsAndReceivesBothWays) {
  comm::run_threads(2, [](comm::Communicator& world) {
    const int other = 1 - world.rank();
    comm::PeerChannels links(world, {{0, 1, 7}, {1, 0, 7}});
    Tensor in(Shape{3}, DType::f32);
    const std::vector<comm::Work> works = links.batch_isend_irecv(
        {{comm::PeerOp::Kind::recv, in, other, 7, "x"},
         {comm::PeerOp::Kind::send, Tensor::full(Shape{3}, DType::f32, world.rank() + 1.0), other,
          7, "x"}});
    for (const comm::Work& w : works)
      w.wait();
    EXPECT_EQ(in.values<float>()[0], static_cast<float>(other + 1));
  });
}

TEST(PeerChannels, AMismatchedPairIsAnErrorNamingBothSides) {
  try {
    comm::run_threads(2, [](comm::Communicator& world) {
      comm::PeerChannels links(world, {{0, 1, 0}});
      if (world.rank() == 0) {
        links.send(Tensor::zeros(Shape{4}, DType::f32), 1, 0, "activation 0");
      } else {
        Tensor wrong(Shape{8}, DType::f32);
        links.recv(wrong, 0, 0, "activation 0");
      }
    });
    FAIL() << "a 4-element send met an 8-element receive";
  } catch (const DesyncError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("4 elements"), std::string::npos) << what;
    EXPECT_NE(what.find("8 elements"), std::string::npos) << what;
  }
}

TEST(PeerChannels, AReceiveNobodySendsTimesOut) {
  comm::CollectiveOptions quick;
  quick.timeout = std::chrono::milliseconds(300);
  EXPECT_THROW(comm::run_threads(2,
                                 [&](comm::Communicator& world) {
                                   comm::PeerChannels links(world, {{0, 1, 0}}, quick);
                                   if (world.rank() == 1) {
                                     Tensor never(Shape{2}, DType::f32);
                                     links.recv(never, 0, 0, "never sent");
                                   }
                                 }),
               CommError);
  EXPECT_THROW(comm::run_threads(2,
                                 [](comm::Communicator& world) {
                                   comm::PeerChannels links(world, {{0, 1, 0}});
                                   links.send(Tensor::zeros(Shape{1}, DType::f32), 1, 3);
                                 }),
               InvalidArgument);  // no link with tag 3
}

/// Stage s adds s + 1 forward and doubles the gradient backward; the last stage's loss
/// gradient is its output. Records the order of its calls.
class AddStages : public StageWork {
 public:
  explicit AddStages(const ScheduleConfig& config, std::int64_t rank)
      : config_(config), rank_(rank) {}
  Tensor first_input(std::int64_t mb) override {
    return Tensor::full(Shape{2, 1, 3}, DType::f32, static_cast<double>(mb));
  }
  Shape boundary_shape(std::int64_t) override { return Shape{2, 1, 3}; }
  Tensor forward(std::int64_t chunk, std::int64_t, const Tensor& input) override {
    Tensor out = input.clone();
    for (float& v : out.values<float>())
      v += static_cast<float>(stage_of(config_, rank_, chunk) + 1);
    return out;
  }
  Tensor loss_gradient(std::int64_t mb, const Tensor& output) override {
    outputs[mb] = output.values<float>()[0];
    return Tensor::full(output.shape(), DType::f32, 1.0);
  }
  Tensor backward(std::int64_t chunk, std::int64_t mb, const Tensor& grad) override {
    Tensor out = grad.clone();
    for (float& v : out.values<float>())
      v *= 2.0F;
    if (stage_of(config_, rank_, chunk) == 0) input_grads[mb] = out.values<float>()[0];
    return out;
  }
  std::map<std::int64_t, float> outputs;
  std::map<std::int64_t, float> input_grads;

 private:
  ScheduleConfig config_;
  std::int64_t rank_;
};

TEST(Pipeline, EverySchedulePassesActivationsAndGradientsThroughEveryStage) {
  for (const ScheduleConfig& config : {ScheduleConfig{ScheduleKind::one_f_one_b, 4, 1, 8},
                                       ScheduleConfig{ScheduleKind::gpipe, 3, 1, 2},
                                       ScheduleConfig{ScheduleKind::interleaved_1f1b, 2, 2, 4},
                                       ScheduleConfig{ScheduleKind::interleaved_1f1b, 1, 2, 3}}) {
    SCOPED_TRACE(describe(config));
    const std::int64_t stages = config.stages();
    comm::run_threads(static_cast<int>(config.ranks), [&](comm::Communicator& world) {
      Pipeline pipeline(world, config);
      AddStages work(config, world.rank());
      pipeline.run_step(work);
      if (pipeline.has_last_stage()) {
        ASSERT_EQ(static_cast<std::int64_t>(work.outputs.size()), config.micro_batches);
        for (const auto& [mb, value] : work.outputs)
          EXPECT_EQ(value, static_cast<float>(mb + stages * (stages + 1) / 2));
      }
      if (pipeline.has_first_stage()) {
        for (const auto& [mb, value] : work.input_grads)
          EXPECT_EQ(value, static_cast<float>(1 << stages));
      }
      const Tensor logits = pipeline.forward_only(work);
      EXPECT_EQ(logits.values<float>()[0], static_cast<float>(stages * (stages + 1) / 2));
    });
  }
}

nn::GptConfig tiny_gpt() {
  return testing::tiny_gpt({.vocabulary = 32, .seed = 5});
}

Tensor tokens(std::uint64_t seed) {
  Tensor t(Shape{2, 8}, DType::i64);
  for (std::size_t i = 0; i < 16; ++i)
    t.values<std::int64_t>()[i] = static_cast<std::int64_t>((seed * 7 + i * 5) % 32);
  return t;
}

/// Backward of `logits`'s sum: a fixed gradient.
Tensor ones_like(const Tensor& t) {
  return Tensor::full(t.shape(), DType::f32, 0.01);
}

TEST(ActivationStash, InterleavedMicroBatchesGiveTheSequentialGradients) {
  nn::Gpt sequential_model(tiny_gpt());
  nn::DenseGradients sequential(sequential_model.parameters());
  for (std::uint64_t mb = 0; mb < 2; ++mb) {
    const Tensor logits = sequential_model.forward(tokens(mb));
    sequential_model.backward(ones_like(logits), sequential, false);
  }
  nn::Gpt model(tiny_gpt());
  nn::DenseGradients interleaved(model.parameters());
  const Tensor first = model.forward(tokens(0));
  nn::ActivationStash stash = nn::ActivationStash::take(model);
  EXPECT_GT(stash.bytes(), 0);
  EXPECT_EQ(nn::kept_bytes(model), 0);
  const Tensor second = model.forward(tokens(1));
  nn::ActivationStash later = nn::ActivationStash::take(model);
  stash.restore(model);
  model.backward(ones_like(first), interleaved, false);
  later.restore(model);
  model.backward(ones_like(second), interleaved, false);
  EXPECT_EQ(sequential.sums().digest(), interleaved.sums().digest());
}

TEST(StageModule, CheckpointedBlocksGiveTheSameBitsAndKeepLess) {
  for (const bool checkpoint : {false, true}) {
    SCOPED_TRACE(checkpoint);
    nn::Gpt reference(tiny_gpt());
    nn::Gpt model(tiny_gpt());
    StageModule stage(model.children(), false);
    stage.set_checkpointed({false, checkpoint, checkpoint, false});
    const Tensor expected = reference.forward(tokens(3));
    const Tensor got = stage.forward(tokens(3));
    EXPECT_EQ(expected.digest(), got.digest());
    const std::int64_t kept = nn::kept_bytes(stage);
    const std::int64_t kept_by_reference = nn::kept_bytes(reference);
    if (checkpoint) {
      EXPECT_LT(2 * kept, kept_by_reference);
    } else {
      EXPECT_EQ(kept, kept_by_reference);
    }
    nn::DenseGradients a(reference.parameters());
    nn::DenseGradients b(model.parameters());
    reference.backward(ones_like(expected), a, false);
    stage.backward(ones_like(got), b, false);
    EXPECT_EQ(a.sums().digest(), b.sums().digest());
    EXPECT_EQ(stage.take_backward_peak() > 0, checkpoint);
  }
}

}  // namespace
}  // namespace meshtensor::pp
