#include <cmath>
#include <functional>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <meshtensor/comm/threads_backend.hpp>
#include <meshtensor/core/error.hpp>
#include <meshtensor/dtensor/comm_debug.hpp>
#include <meshtensor/kernels/matmul.hpp>
#include <meshtensor/mesh/layout.hpp>
#include <meshtensor/nn/gradients.hpp>
#include <meshtensor/nn/layers.hpp>
#include <meshtensor/tp/ops.hpp>
#include <meshtensor/tp/style.hpp>

namespace meshtensor {

/// Specs print as text in failures.
void PrintTo(const PlacementSpec& spec, std::ostream* os) {
  *os << spec.to_string();
}

namespace tp {
namespace {

using dtensor::CommDebugMode;
using dtensor::OpSchema;
using dtensor::OpStrategy;

const Placement R = Placement::replicate();
const Placement P = Placement::partial(ReduceOp::sum);
Placement S(int d) {
  return Placement::shard(d);
}
PlacementSpec spec(std::vector<Placement> p) {
  return PlacementSpec(std::move(p));
}

OpStrategy propagate_matmul(const DeviceMesh& mesh, const Shape& a, const PlacementSpec& sa,
                            const Shape& b, const PlacementSpec& sb,
                            MatmulForm form = MatmulForm::nn) {
  const OpSchema schema{
      "matmul", {a, b}, {sa, sb}, {DType::f32, DType::f32}, dtensor::matmul_strategies(a, b, form)};
  return dtensor::select_strategy(mesh, schema);
}

TEST(ShardingPropagation, ContractionShardedInBothInputsGivesPartial) {
  const DeviceMesh mesh({4}, {"tp"});
  const OpStrategy s =
      propagate_matmul(mesh, Shape{8, 12}, spec({S(1)}), Shape{12, 6}, spec({S(0)}));
  EXPECT_EQ(s.output, spec({P}));
  EXPECT_EQ(s.inputs[0], spec({S(1)}));
  EXPECT_EQ(s.inputs[1], spec({S(0)}));
  EXPECT_EQ(s.redistribute_collectives, 0);
  EXPECT_EQ(s.redistribute_cost_s, 0.0);
}

TEST(ShardingPropagation, ColumnShardedWeightGivesLastDimSharded) {
  const DeviceMesh mesh({2}, {"tp"});
  const OpStrategy s =
      propagate_matmul(mesh, Shape{2, 5, 12}, spec({R}), Shape{12, 6}, spec({S(1)}));
  EXPECT_EQ(s.output, spec({S(2)}));
}

TEST(ShardingPropagation, PrefersTheCheaperMove) {
  // a's contraction dim is sharded and b is whole: slicing b locally (no communication) beats
  // gathering the large a, so the output is Partial.
  const DeviceMesh mesh({4}, {"tp"});
  const OpStrategy s =
      propagate_matmul(mesh, Shape{64, 1024}, spec({S(1)}), Shape{1024, 8}, spec({R}));
  EXPECT_EQ(s.inputs[1], spec({S(0)}));
  EXPECT_EQ(s.output, spec({P}));
  EXPECT_EQ(s.redistribute_collectives, 0);
  // The other way round (a small, b large and sharded by columns) gathers nothing either.
  const OpStrategy t =
      propagate_matmul(mesh, Shape{4, 16}, spec({S(0)}), Shape{16, 4096}, spec({S(1)}));
  EXPECT_GE(t.candidates, 2);
  EXPECT_EQ(t.redistribute_collectives, 1);  // one input must move: a is the smaller
  EXPECT_EQ(t.inputs[1], spec({S(1)}));
}

TEST(ShardingPropagation, StrategiesComposePerMeshDim) {
  const DeviceMesh mesh({2, 2}, {"dp", "tp"});
  const OpStrategy s =
      propagate_matmul(mesh, Shape{8, 12}, spec({S(0), S(1)}), Shape{12, 6}, spec({R, S(0)}));
  EXPECT_EQ(s.output, spec({S(0), P}));
  EXPECT_EQ(s.redistribute_collectives, 0);
}

TEST(ShardingPropagation, WeightGradientFormSumsOverTheSequenceShards) {
  const DeviceMesh mesh({2}, {"tp"});
  const OpStrategy s = propagate_matmul(mesh, Shape{4, 6, 8}, spec({S(1)}), Shape{4, 6, 5},
                                        spec({S(1)}), MatmulForm::tn);
  EXPECT_EQ(s.output, spec({P}));
  EXPECT_EQ(s.redistribute_collectives, 0);
}

TEST(ShardingPropagation, NonlinearOpsNeverRunOnPartialSums) {
  const DeviceMesh mesh({4}, {"tp"});
  const Shape x{8, 16};
  const OpSchema schema{
      "gelu", {x}, {spec({P})}, {DType::f32}, dtensor::pointwise_strategies(x, false)};
  const OpStrategy s = dtensor::select_strategy(mesh, schema);
  EXPECT_FALSE(s.inputs[0].at(0).is_partial());
  EXPECT_EQ(s.redistribute_collectives, 1);
  const OpSchema linear{
      "scale", {x}, {spec({P})}, {DType::f32}, dtensor::pointwise_strategies(x, true)};
  EXPECT_EQ(dtensor::select_strategy(mesh, linear).output, spec({P}));
}

// ---- numerics on thread ranks ----

/// Runs `body` on every rank of a threads world over `mesh`.
void on_mesh(const DeviceMesh& mesh,
             const std::function<void(std::shared_ptr<comm::MeshGroups>)>& body) {
  comm::run_threads(static_cast<int>(mesh.size()), [&](std::shared_ptr<comm::Communicator> world) {
    body(std::make_shared<comm::MeshGroups>(mesh, world));
  });
}

Tensor whole_matmul(const Tensor& a, const Tensor& b) {
  Tensor c(Shape{a.shape()[0], b.shape()[1]}, DType::f32);
  kernels::matmul(a, kernels::Transpose::no, b, kernels::Transpose::no, c);
  return c;
}

void expect_near(const Tensor& got, const Tensor& want, double tolerance) {
  ASSERT_EQ(got.shape(), want.shape());
  const Tensor g = got.contiguous();
  const Tensor w = want.contiguous();
  for (std::int64_t i = 0; i < g.numel(); ++i) {
    const std::int64_t index[] = {i};
    ASSERT_NEAR(g.flatten().get(index), w.flatten().get(index), tolerance) << "element " << i;
  }
}

TEST(DTensorOps, MatmulOnAnyPlacementsMatchesTheWholeProduct) {
  const Tensor a = Tensor::random_normal(Shape{7, 13}, DType::f32, 1);  // uneven over 2 and 4
  const Tensor b = Tensor::random_normal(Shape{13, 9}, DType::f32, 2);
  const Tensor want = whole_matmul(a, b);
  const std::vector<std::pair<PlacementSpec, PlacementSpec>> cases{
      {spec({R, R}), spec({R, R})},
      {spec({S(0), R}), spec({R, S(1)})},
      {spec({S(1), S(1)}), spec({R, R})},
      {spec({R, S(1)}), spec({R, S(0)})},
      {spec({S(0), S(1)}), spec({S(1), S(0)})}};
  for (const auto& [sa, sb] : cases) {
    SCOPED_TRACE(sa.to_string() + " x " + sb.to_string());
    on_mesh(DeviceMesh({2, 2}, {"dp", "tp"}), [&](auto groups) {
      const DTensor y =
          matmul(dtensor::distribute(a, groups, sa), dtensor::distribute(b, groups, sb));
      const Tensor full = y.full_tensor();
      const bool contraction_split = !y.spec().partial_mesh_dims().empty();
      if (contraction_split) {
        expect_near(full, want, 1e-4);
      } else {
        EXPECT_TRUE(full.bitwise_equal(want)) << y.spec().to_string();
      }
    });
  }
}

TEST(DTensorOps, MegatronMlpRunsOneAllReduceAndMatchesTheWholeLayer) {
  const Tensor x = Tensor::random_normal(Shape{2, 5, 16}, DType::f32, 3);
  const Tensor w1 = Tensor::random_normal(Shape{16, 32}, DType::f32, 4);
  const Tensor b1 = Tensor::random_normal(Shape{32}, DType::f32, 5);
  const Tensor w2 = Tensor::random_normal(Shape{32, 16}, DType::f32, 6);
  Tensor want;
  on_mesh(DeviceMesh({1}, {"tp"}), [&](auto groups) {
    const auto put = [&](const Tensor& t) { return dtensor::distribute(t, groups, spec({R})); };
    want = matmul(gelu(add(matmul(put(x), put(w1)), put(b1))), put(w2)).full_tensor();
  });
  on_mesh(DeviceMesh({4}, {"tp"}), [&](auto groups) {
    CommDebugMode mode;
    const auto put = [&](const Tensor& t, Placement p) {
      return dtensor::distribute(t, groups, spec({p}));
    };
    const DTensor hidden = gelu(add(matmul(put(x, R), put(w1, S(1))), put(b1, S(0))));
    EXPECT_EQ(hidden.spec(), spec({S(2)}));
    const DTensor partial = matmul(hidden, put(w2, S(0)));
    EXPECT_EQ(partial.spec(), spec({P}));
    EXPECT_EQ(mode.count(), 0);  // column then row parallel: nothing moved so far
    const Tensor y = partial.redistribute(spec({R})).local();
    EXPECT_EQ(mode.count(), 1);
    EXPECT_EQ(mode.count("all_reduce"), 1);
    ASSERT_EQ(mode.ops().size(), 5U);
    EXPECT_EQ(mode.ops()[0].op, "matmul nn");
    EXPECT_EQ(mode.ops()[3].strategy.output, spec({P}));
    EXPECT_EQ(mode.ops()[4].op, "redistribute");
    EXPECT_NE(mode.to_text().find("all_reduce"), std::string::npos);
    EXPECT_EQ(mode.to_json()["counts"]["all_reduce"], 1);
    expect_near(y, want, 1e-4);
  });
}

TEST(DTensorOps, RowOpsOnSequenceShardsEqualTheReplicatedBits) {
  const Tensor x = Tensor::random_normal(Shape{2, 7, 6}, DType::f32, 8);
  const Tensor w = Tensor::random_normal(Shape{6}, DType::f32, 9);
  const Tensor b = Tensor::random_normal(Shape{6}, DType::f32, 10);
  for (const Placement& p : {R, S(1), S(0)}) {
    on_mesh(DeviceMesh({3}, {"tp"}), [&](auto groups) {
      const DTensor xs = dtensor::distribute(x, groups, spec({p}));
      const DTensor ws = dtensor::distribute(w, groups, spec({R}));
      const DTensor bs = dtensor::distribute(b, groups, spec({R}));
      const DTensor xr = dtensor::distribute(x, groups, spec({R}));
      const DTensor norm = layer_norm(xs, ws, bs);
      EXPECT_EQ(norm.spec(), spec({p}));
      EXPECT_TRUE(norm.full_tensor().bitwise_equal(layer_norm(xr, ws, bs).local()));
      EXPECT_TRUE(softmax(xs).full_tensor().bitwise_equal(softmax(xr).local()));
      EXPECT_TRUE(gelu(xs).full_tensor().bitwise_equal(gelu(xr).local()));
      EXPECT_TRUE(scale(xs, 0.5).full_tensor().bitwise_equal(scale(xr, 0.5).local()));
    });
  }
}

TEST(DTensorOps, AttentionWithHeadsShardedEqualsTheReplicatedBits) {
  const Shape shape{2, 4, 5, 3};
  const Tensor q = Tensor::random_normal(shape, DType::f32, 11);
  const Tensor k = Tensor::random_normal(shape, DType::f32, 12);
  const Tensor v = Tensor::random_normal(shape, DType::f32, 13);
  on_mesh(DeviceMesh({2}, {"tp"}), [&](auto groups) {
    const auto put = [&](const Tensor& t, Placement p) {
      return dtensor::distribute(t, groups, spec({p}));
    };
    const DTensor heads = attention(put(q, S(1)), put(k, S(1)), put(v, S(1)));
    EXPECT_EQ(heads.spec(), spec({S(1)}));
    const Tensor whole = attention(put(q, R), put(k, R), put(v, R)).local();
    EXPECT_TRUE(heads.full_tensor().bitwise_equal(whole));
  });
}

TEST(DTensorOps, VocabularyParallelEmbeddingAndLossEqualTheReplicatedBits) {
  const Tensor table = Tensor::random_normal(Shape{11, 4}, DType::f32, 14);
  const Tensor ids = Tensor::random_int(Shape{3, 5}, DType::i32, 15, 0, 10);
  // Large enough that three all-reduces of one value per row cost less than gathering the logits.
  const Tensor logits = Tensor::random_normal(Shape{64, 65536}, DType::f32, 16);
  const Tensor labels = Tensor::random_int(Shape{64}, DType::i32, 17, 0, 65535);
  const Tensor small = logits.narrow(1, 0, 11).contiguous();
  const Tensor small_labels = Tensor::random_int(Shape{64}, DType::i32, 18, 0, 10);
  dtensor::RedistributeOptions exact;
  exact.mode = comm::ReductionMode::exact;
  on_mesh(DeviceMesh({4}, {"tp"}), [&](auto groups) {
    const auto put = [&](const Tensor& t, Placement p) {
      return dtensor::distribute(t, groups, spec({p}));
    };
    const Tensor whole = embedding(put(table, R), put(ids, R)).local();
    const DTensor rows = embedding(put(table, S(0)), put(ids, R));
    EXPECT_EQ(rows.spec(), spec({P}));
    EXPECT_TRUE(rows.full_tensor().bitwise_equal(whole));
    const DTensor columns = embedding(put(table, S(1)), put(ids, R));
    EXPECT_EQ(columns.spec(), spec({S(2)}));
    EXPECT_TRUE(columns.full_tensor().bitwise_equal(whole));

    const Tensor loss = cross_entropy(put(logits, R), put(labels, R), exact).local();
    CommDebugMode mode;
    const DTensor parallel = cross_entropy(put(logits, S(1)), put(labels, R), exact);
    EXPECT_EQ(parallel.spec(), spec({R}));
    EXPECT_TRUE(parallel.local().bitwise_equal(loss));
    EXPECT_EQ(mode.count("all_reduce"), 3);  // maxima, exact sums, target logits
    EXPECT_EQ(mode.ops().back().strategy.internal_collectives, 3);
    // Small logits are cheaper to gather than to reduce over three times.
    EXPECT_EQ(cross_entropy(put(small, S(1)), put(small_labels, R)).spec(), spec({R}));
    EXPECT_EQ(mode.ops().back().strategy.inputs[0], spec({R}));
    // Rows split unevenly (63 over 4): the partial means add up to the mean.
    const Tensor rows63 = small.narrow(0, 0, 63).contiguous();
    const Tensor labels63 = small_labels.narrow(0, 0, 63).contiguous();
    const DTensor by_rows = cross_entropy(put(rows63, S(0)), put(labels63, S(0)));
    EXPECT_EQ(by_rows.spec(), spec({P}));
    const double mean =
        cross_entropy(put(rows63, R), put(labels63, R)).local().template values<double>()[0];
    EXPECT_NEAR(by_rows.full_tensor().template values<double>()[0], mean, 1e-12);
  });
}

/// LayerNorm, Linear(16, 32), GELU, Linear(32, 16): a block whose norm runs on sequence shards.
std::unique_ptr<nn::Sequential> block() {
  auto model = std::make_unique<nn::Sequential>();
  model->add(std::make_unique<nn::LayerNorm>(16));
  model->add(std::make_unique<nn::Linear>(16, 32, 21, 0.2));
  model->add(std::make_unique<nn::GELU>());
  model->add(std::make_unique<nn::Linear>(32, 16, 22, 0.2));
  return model;
}

TEST(ParallelStyles, PrepareModuleInputAndOutputMoveActivationsAtTheBoundary) {
  const Tensor x = Tensor::random_normal(Shape{2, 7, 16}, DType::f32, 23);  // 7: uneven over 2
  const Tensor dy = Tensor::random_normal(Shape{2, 7, 16}, DType::f32, 24);
  auto whole = block();
  nn::DenseGradients unused(whole->parameters());
  const Tensor want_y = whole->forward(x);
  const Tensor want_dx = whole->backward(dy, unused, true);
  comm::run_threads(2, [&](std::shared_ptr<comm::Communicator> world) {
    auto model = block();
    TensorParallel tp(world, comm::ReductionMode::ordered, true);
    const ParallelizePlan plan{{"0", std::make_shared<SequenceParallel>()},
                               {"1", std::make_shared<PrepareModuleInput>(S(1), R)},
                               {"1", std::make_shared<ColwiseParallel>(R)},
                               {"3", std::make_shared<RowwiseParallel>(R)},
                               {"3", std::make_shared<PrepareModuleOutput>(R, S(1))}};
    const auto applied = parallelize_module(*model, tp, plan);
    EXPECT_EQ(applied[1].second, "PrepareModuleInput(Shard(1) -> Replicate)");
    const Chunk mine = chunk_extent(7, 2, tp.rank());
    const Tensor local_x = x.narrow(1, mine.offset, mine.size).contiguous();
    tp.log().enable(true);
    const Tensor y = model->forward(local_x);
    expect_near(y, want_y.narrow(1, mine.offset, mine.size), 1e-5);
    EXPECT_EQ(tp.log().count("all_gather", "forward"), 1);  // the block's input, once
    EXPECT_EQ(tp.log().count("all_reduce", "forward"), 1);  // the row-parallel output
    nn::DenseGradients grads(model->parameters());
    const Tensor dx =
        model->backward(dy.narrow(1, mine.offset, mine.size).contiguous(), grads, true);
    expect_near(dx, want_dx.narrow(1, mine.offset, mine.size), 1e-5);
    EXPECT_EQ(tp.log().count("all_gather", "backward"), 1);  // the output gradient
    EXPECT_EQ(tp.log().count("all_reduce", "backward"), 1);  // the column-parallel input grad
  });
  EXPECT_THROW(PrepareModuleInput(P, R), InvalidArgument);
}

TEST(DTensorOps, BadInputsNameTheValues) {
  on_mesh(DeviceMesh({2}, {"tp"}), [&](auto groups) {
    const auto put = [&](const Tensor& t) { return dtensor::distribute(t, groups, spec({R})); };
    const DTensor a = put(Tensor::zeros(Shape{4, 3}, DType::f32));
    const DTensor b = put(Tensor::zeros(Shape{5, 2}, DType::f32));
    try {
      matmul(a, b);
      ADD_FAILURE() << "no error";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("4x3"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("5x2"), std::string::npos) << e.what();
    }
    const DTensor table = put(Tensor::zeros(Shape{6, 2}, DType::f32));
    Tensor ids = Tensor::full(Shape{2}, DType::i32, 6);
    try {
      embedding(table, put(ids));
      ADD_FAILURE() << "no error";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("id 6"), std::string::npos) << e.what();
    }
    EXPECT_THROW(add(a, b), InvalidArgument);
  });
}

}  // namespace
}  // namespace tp
}  // namespace meshtensor
