#include <map>
#include <mutex>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <meshtensor/comm/threads_backend.hpp>
#include <meshtensor/core/error.hpp>
#include <meshtensor/dtensor/comm_debug.hpp>
#include <meshtensor/nn/gpt.hpp>
#include <meshtensor/nn/gradients.hpp>
#include <meshtensor/tp/style.hpp>

#include "support/tiny_gpt.hpp"

namespace meshtensor::tp {
namespace {

nn::GptConfig small_config() {
  // A vocabulary of 61 splits unevenly over 2, 3 and 4 ranks.
  return testing::tiny_gpt({.heads = 4, .dim = 32, .context = 12, .vocabulary = 61, .seed = 7});
}

Tensor tokens(std::int64_t batch, std::int64_t length, std::int64_t vocabulary) {
  return Tensor::random_int(Shape{batch, length}, DType::i64, 11, 0, vocabulary);
}

/// What one rank of one layout computed: the whole logits, the loss of every row and the
/// gradient of every parameter, placed in the whole parameter's shape.
struct Outcome {
  Tensor logits;
  Tensor losses;
  std::map<std::string, Tensor> grads;  // parameters whose gradient is whole on this rank
};

/// Forward, loss and backward of the small GPT on `degree` thread ranks of one tensor-parallel
/// group; returns rank 0's outcome and checks every rank's logits equal it.
Outcome run_degree(int degree, bool sequence_parallel, comm::ReductionMode mode) {
  const nn::GptConfig config = small_config();
  const bool exact = mode == comm::ReductionMode::exact;
  const Tensor input = tokens(3, 10, config.vocabulary);
  std::vector<std::int32_t> labels(30);
  for (std::size_t i = 0; i < labels.size(); ++i)
    labels[i] = static_cast<std::int32_t>((i * 7) % config.vocabulary);
  std::mutex mutex;
  std::vector<Outcome> outcomes(static_cast<std::size_t>(degree));
  comm::run_threads(degree, [&](std::shared_ptr<comm::Communicator> world) {
    nn::Gpt model(config);
    model.set_exact_sums(exact);
    TensorParallel tp(world, mode, sequence_parallel);
    parallelize_module(model, tp, decoder_plan(model.spec(), sequence_parallel));
    const Tensor logits = model.forward(input);
    const nn::CrossEntropyResult loss = parallel_cross_entropy(
        logits.reshape(Shape{30, logits.shape()[2]}), labels, &tp, config.vocabulary, exact);
    nn::BinnedGradients sums(model.parameters());
    sums.clear();
    model.backward(loss.grad_logits.reshape(logits.shape()), sums, false);
    sums.finish(1);
    Outcome outcome;
    outcome.logits = degree > 1 ? gather_classes(tp, logits, config.vocabulary) : logits;
    outcome.losses = loss.losses;
    for (nn::Parameter* p : model.parameters()) {
      if (p->split.partial_gradients) continue;
      outcome.grads[p->name] = p->grad.clone();
    }
    const std::lock_guard lock(mutex);
    outcomes[static_cast<std::size_t>(world->rank())] = std::move(outcome);
  });
  for (const Outcome& o : outcomes) {
    EXPECT_EQ(o.logits.digest(), outcomes.front().logits.digest());
    EXPECT_EQ(o.losses.digest(), outcomes.front().losses.digest());
  }
  return outcomes.front();
}

TEST(TensorParallel, ExactLogitsLossesAndGradientsDoNotDependOnTheDegree) {
  const Outcome whole = run_degree(1, false, comm::ReductionMode::exact);
  for (const int degree : {2, 4}) {
    for (const bool sequence : {false, true}) {
      SCOPED_TRACE(fmt::format("tp {} sequence parallel {}", degree, sequence));
      const Outcome split = run_degree(degree, sequence, comm::ReductionMode::exact);
      EXPECT_EQ(split.logits.digest(), whole.logits.digest());
      EXPECT_EQ(split.losses.digest(), whole.losses.digest());
      // Rank 0's blocks of every parameter gradient equal the same block of the whole one.
      for (const auto& [name, grad] : split.grads) {
        const Tensor& reference = whole.grads.at(name);
        Tensor block = reference;
        for (int d = 0; d < grad.rank(); ++d)
          block = block.narrow(d, 0, grad.shape()[d]);
        EXPECT_EQ(block.contiguous().digest(), grad.digest()) << name;
      }
    }
  }
}

TEST(TensorParallel, OrderedRanksAgreeAndRunsRepeat) {
  const Outcome whole = run_degree(1, false, comm::ReductionMode::ordered);
  for (const bool sequence : {false, true}) {
    const Outcome a = run_degree(2, sequence, comm::ReductionMode::ordered);
    const Outcome b = run_degree(2, sequence, comm::ReductionMode::ordered);
    EXPECT_EQ(a.logits.digest(), b.logits.digest());
    // Ordered sums split over ranks round differently: what exact mode's blocks are for.
    EXPECT_NE(a.logits.digest(), whole.logits.digest());
  }
}

/// The collectives of one forward and backward of the small GPT on 2 ranks, counted by kind and
/// phase on rank 0, with the local shapes checked: every split parameter and the logits hold
/// this rank's chunk only.
std::map<std::string, std::int64_t> collective_counts(bool sequence_parallel,
                                                      comm::ReductionMode mode) {
  const nn::GptConfig config = small_config();
  const Tensor input = tokens(2, 10, config.vocabulary);
  const std::vector<std::int32_t> labels(20, 3);
  std::map<std::string, std::int64_t> counts;
  comm::run_threads(2, [&](std::shared_ptr<comm::Communicator> world) {
    nn::Gpt model(config);
    model.set_exact_sums(mode == comm::ReductionMode::exact);
    TensorParallel tp(world, mode, sequence_parallel);
    parallelize_module(model, tp, decoder_plan(model.spec(), sequence_parallel));
    for (nn::Parameter* p : model.parameters()) {
      if (p->name == "blocks.0.attn.qkv.weight") {
        EXPECT_EQ(p->value.shape(), Shape({32, 48}));
      } else if (p->name == "blocks.0.mlp.proj.weight") {
        EXPECT_EQ(p->value.shape(), Shape({64, 32}));
      } else if (p->name == "embed.token.weight") {
        EXPECT_EQ(p->value.shape()[0], 31 - world->rank());
      }
    }
    tp.log().enable(true);
    dtensor::CommDebugMode debug;
    const Tensor logits = model.forward(input);
    EXPECT_EQ(logits.shape()[2], 31 - world->rank());
    const nn::CrossEntropyResult loss = parallel_cross_entropy(
        logits.reshape(Shape{20, logits.shape()[2]}), labels, &tp, config.vocabulary, false);
    nn::DenseGradients sums(model.parameters());
    model.backward(loss.grad_logits.reshape(logits.shape()), sums, false);
    // Only activations move (weights stay in their blocks), and no move holds a whole tensor its
    // placements do not ask for: with SP, partial sums are reduce-scattered, never reduced whole.
    EXPECT_FALSE(debug.materialized_full_tensor());
    const std::int64_t elements = 2 * 10 * config.dim;  // an activation [batch, sequence, dim]
    for (const dtensor::OpRecord& op : debug.ops()) {
      for (const dtensor::CollectiveRecord& c : op.collectives) {
        EXPECT_TRUE(c.purpose.find("weight") == std::string::npos) << c.purpose;
        // Each rank sends its share (half on 2 ranks): f32 values, or binned exact states (a bin
        // and three digit sums) for exact partial sums.
        const bool binned = mode == comm::ReductionMode::exact && c.kind == "reduce_scatter";
        if (c.kind == "reduce_scatter" || c.kind == "all_gather") {
          EXPECT_LE(c.send_bytes, elements / 2 * (binned ? 28 : 4)) << c.purpose;
        }
      }
    }
    EXPECT_EQ(debug.count(), static_cast<std::int64_t>(tp.log().events().size()));
    if (world->rank() != 0) return;
    for (const CommEvent& e : tp.log().events())
      if (e.module != "loss") ++counts[e.phase + " " + e.collective];
  });
  return counts;
}

TEST(TensorParallel, CollectivesPerBlockAreMegatrons) {
  const std::int64_t layers = small_config().layers;
  for (const auto mode : {comm::ReductionMode::ordered, comm::ReductionMode::exact}) {
    // Without SP: one all-reduce after each row-parallel output (attention, MLP, embedding)
    // forward, one for each column-parallel input gradient (qkv, fc, LM head) backward.
    std::map<std::string, std::int64_t> plain = collective_counts(false, mode);
    EXPECT_EQ(plain,
              (std::map<std::string, std::int64_t>{{"forward all_reduce", 2 * layers + 1},
                                                   {"backward all_reduce", 2 * layers + 1}}));
    // With SP: each all-reduce becomes a reduce-scatter and an all-gather.
    std::map<std::string, std::int64_t> sequence = collective_counts(true, mode);
    EXPECT_EQ(sequence,
              (std::map<std::string, std::int64_t>{{"forward all_gather", 2 * layers + 1},
                                                   {"forward reduce_scatter", 2 * layers + 1},
                                                   {"backward all_gather", 2 * layers + 1},
                                                   {"backward reduce_scatter", 2 * layers + 1}}));
  }
}

TEST(TensorParallel, PatternsMatchWholeComponents) {
  EXPECT_TRUE(matches_pattern("blocks.*.attn.qkv", "blocks.0.attn.qkv"));
  EXPECT_TRUE(matches_pattern("blocks.*.attn.qkv", "blocks.12.attn.qkv"));
  EXPECT_FALSE(matches_pattern("blocks.*.attn.qkv", "blocks.0.x.attn.qkv"));
  EXPECT_TRUE(matches_pattern("head.*", "head.norm"));
  EXPECT_FALSE(matches_pattern("head", "head.norm"));
  EXPECT_TRUE(matches_pattern("*", "embed"));
}

TEST(TensorParallel, BadPlansAndDegreesNameTheValues) {
  comm::run_threads(2, [&](std::shared_ptr<comm::Communicator> world) {
    nn::Gpt model(small_config());
    TensorParallel tp(world, comm::ReductionMode::ordered, false);
    try {
      parallelize_module(model, tp, {{"blocks.*.nothing", std::make_shared<ColwiseParallel>()}});
      ADD_FAILURE() << "no error";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("blocks.*.nothing"), std::string::npos);
    }
    EXPECT_THROW(
        parallelize_module(model, tp, {{"blocks.0.norm1", std::make_shared<ColwiseParallel>()}}),
        InvalidArgument);
  });
  try {
    check_decoder_degree(small_config(), 3);
    ADD_FAILURE() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("degree 3"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("4 heads"), std::string::npos);
  }
}

}  // namespace
}  // namespace meshtensor::tp
