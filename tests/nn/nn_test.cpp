#include <cmath>
#include <memory>
#include <vector>

#include <gtest/gtest.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/kernels/binned_sum.hpp>
#include <meshtensor/kernels/portable_math.hpp>
#include <meshtensor/nn/gradients.hpp>
#include <meshtensor/nn/layers.hpp>
#include <meshtensor/nn/loss.hpp>
#include <meshtensor/nn/mlp.hpp>
#include <meshtensor/nn/optim.hpp>

#include "support/finite_differences.hpp"

namespace meshtensor::nn {
namespace {

TEST(Modules, LinearGradientsMatchFiniteDifferences) {
  Linear linear(5, 3, 1);
  check_gradients(linear, Tensor::random_normal(Shape{4, 5}, DType::f32, 2), 2e-2);
}

TEST(Modules, ALinearWithoutBiasHasOnlyItsWeight) {
  Linear linear(5, 3, 1, 0.0, /*bias=*/false);
  ASSERT_EQ(linear.parameters().size(), 1u);
  EXPECT_FALSE(linear.has_bias());
  EXPECT_EQ(linear.describe(), "Linear(5, 3, bias=false)");
  check_gradients(linear, Tensor::random_normal(Shape{4, 5}, DType::f32, 2), 2e-2);
  // The same weights with a zero bias give the same bits.
  Linear with_bias(5, 3, 1);
  const Tensor x = Tensor::random_normal(Shape{4, 5}, DType::f32, 9);
  EXPECT_EQ(linear.forward(x).digest(), with_bias.forward(x).digest());
}

TEST(Modules, LayerNormGradientsMatchFiniteDifferences) {
  LayerNorm norm(6);
  // Non-trivial scale and shift.
  norm.parameters()[0]->value.copy_from(Tensor::random_normal(Shape{6}, DType::f32, 3));
  norm.parameters()[1]->value.copy_from(Tensor::random_normal(Shape{6}, DType::f32, 4));
  check_gradients(norm, Tensor::random_normal(Shape{3, 6}, DType::f32, 5), 3e-2);
}

TEST(Modules, RmsNormGradientsMatchFiniteDifferences) {
  RMSNorm norm(6, 1e-6);
  norm.parameters()[0]->value.copy_from(Tensor::random_normal(Shape{6}, DType::f32, 3));
  check_gradients(norm, Tensor::random_normal(Shape{3, 6}, DType::f32, 5), 3e-2);
}

TEST(Modules, RmsNormDividesEachRowByItsRootMeanSquare) {
  RMSNorm norm(4, 1e-6);
  const Tensor x =
      Tensor::from_values(Shape{2, 4}, DType::f32, std::vector<double>{1, 2, 3, 4, -2, 0, 0, 2});
  const Tensor y = norm.forward(x);
  const double rms0 = std::sqrt((1 + 4 + 9 + 16) / 4.0 + 1e-6);
  const double rms1 = std::sqrt(8 / 4.0 + 1e-6);
  EXPECT_FLOAT_EQ(y.values<float>()[2], static_cast<float>(3 / rms0));
  EXPECT_FLOAT_EQ(y.values<float>()[4], static_cast<float>(-2 / rms1));
  EXPECT_EQ(norm.parameters().size(), 1u);  // a scale, no shift
  EXPECT_THROW(RMSNorm(0), InvalidArgument);
}

TEST(Modules, GeluAndReluGradientsMatchFiniteDifferences) {
  GELU gelu;
  check_gradients(gelu, Tensor::random_normal(Shape{3, 4}, DType::f32, 6), 2e-2);
  ReLU relu;
  // Away from the kink at 0.
  Tensor x =
      Tensor::from_values(Shape{1, 4}, DType::f32, std::vector<double>{-1.5, -0.2, 0.3, 2.0});
  check_gradients(relu, x, 1e-3);
}

TEST(Gradients, ExactSumsAgreeWithDenseSumsAndDivideOnce) {
  MlpConfig config;
  config.inputs = 12;
  config.hidden = {9};
  config.outputs = 4;
  config.layernorm = true;
  auto model = make_mlp(config);
  const Tensor x = Tensor::random_normal(Shape{20, 12}, DType::f32, 8);
  const std::vector<std::int32_t> labels = {0, 1, 2, 3, 0, 1, 2, 3, 0, 1,
                                            2, 3, 0, 1, 2, 3, 0, 1, 2, 3};
  DenseGradients dense(model->parameters());
  BinnedGradients exact(model->parameters());
  std::vector<Tensor> dense_grads;
  for (GradientSink* sink :
       {static_cast<GradientSink*>(&dense), static_cast<GradientSink*>(&exact)}) {
    const CrossEntropyResult loss = softmax_cross_entropy(model->forward(x), labels);
    model->backward(loss.grad_logits, *sink, false);
    if (sink == &dense) {
      dense.finish(20);
      for (Parameter* p : model->parameters())
        dense_grads.push_back(p->grad.clone());
    } else {
      exact.finish(20);
    }
  }
  const auto parameters = model->parameters();
  for (std::size_t i = 0; i < parameters.size(); ++i) {
    const auto a = dense_grads[i].values<float>();
    const auto b = parameters[i]->grad.values<float>();
    for (std::size_t j = 0; j < a.size(); ++j)
      EXPECT_NEAR(a[j], b[j], 1e-5) << parameters[i]->name;
  }
}

// A sharded runtime empties a parameter's value (reshard) between its backward and the
// reduction that reads the sums: a parameter that got no addition since clear() must still read
// as zeros then, not as what the storage held before.
TEST(Gradients, ExactSumsOfAParameterWithoutAdditionsAreZeroAfterItsValueIsEmptied) {
  Parameter a{"a", Tensor::full(Shape{2, 3}, DType::f32, 1.0), {}, {}};
  Parameter b{"b", Tensor::full(Shape{3}, DType::f32, 1.0), {}, {}};
  BinnedGradients sink({&a, &b});
  const Tensor rows = Tensor::full(Shape{4, 3}, DType::f32, 0.5);
  sink.add_column_sums(b, rows);
  sink.add_outer_products(a, Tensor::full(Shape{4, 2}, DType::f32, 2.0), rows);
  Tensor first(Shape{9}, DType::f32);
  kernels::round_binned_sums(sink.sums(), 1, first);
  EXPECT_EQ(first.values<float>()[0], 4.0f);
  sink.clear();
  sink.add_column_sums(b, rows);  // a gets nothing in this backward
  a.value = Tensor();             // resharded
  Tensor second(Shape{9}, DType::f32);
  kernels::round_binned_sums(sink.sums(), 1, second);
  for (int i = 0; i < 6; ++i)
    EXPECT_EQ(second.values<float>()[static_cast<std::size_t>(i)], 0.0f) << i;
  EXPECT_EQ(second.values<float>()[6], 2.0f);
}

// The loss's bits come from the portable exp and log (kernels::exp_f64, portable_log), not from
// the C library's, so every platform and libc gives them: each row's loss and gradient equal,
// bit for bit, the formula evaluated with those functions.
TEST(Loss, CrossEntropyBitsFollowThePortableExpAndLog) {
  const std::int64_t rows = 64;
  const std::int64_t classes = 97;
  const Tensor logits = Tensor::random_normal(Shape{rows, classes}, DType::f32, 41);
  std::vector<std::int32_t> labels;
  for (std::int64_t r = 0; r < rows; ++r)
    labels.push_back(static_cast<std::int32_t>((r * 31) % classes));
  const CrossEntropyResult result = softmax_cross_entropy(logits, labels);
  const auto z = logits.values<float>();
  for (std::int64_t r = 0; r < rows; ++r) {
    double largest = z[static_cast<std::size_t>(r * classes)];
    for (std::int64_t c = 1; c < classes; ++c)
      largest =
          std::max(largest, static_cast<double>(z[static_cast<std::size_t>(r * classes + c)]));
    std::vector<double> e(static_cast<std::size_t>(classes));
    double total = 0;
    for (std::int64_t c = 0; c < classes; ++c) {
      e[static_cast<std::size_t>(c)] =
          kernels::exp_f64(z[static_cast<std::size_t>(r * classes + c)] - largest);
      total += e[static_cast<std::size_t>(c)];
    }
    const double target =
        z[static_cast<std::size_t>(r * classes + labels[static_cast<std::size_t>(r)])] - largest;
    EXPECT_EQ(result.losses.values<double>()[static_cast<std::size_t>(r)],
              kernels::portable_log(total) - target)
        << "row " << r;
    for (std::int64_t c = 0; c < classes; ++c) {
      const float expected =
          static_cast<float>(e[static_cast<std::size_t>(c)] / total -
                             (c == labels[static_cast<std::size_t>(r)] ? 1.0 : 0.0));
      ASSERT_EQ(result.grad_logits.values<float>()[static_cast<std::size_t>(r * classes + c)],
                expected)
          << r << ", " << c;
    }
  }
}

TEST(Loss, CrossEntropyMatchesLogSumExpAndItsGradient) {
  const Tensor logits =
      Tensor::from_values(Shape{2, 3}, DType::f32, std::vector<double>{1, 2, 3, 0, 0, 5});
  const CrossEntropyResult result = softmax_cross_entropy(logits, std::vector<std::int32_t>{2, 0});
  EXPECT_NEAR(result.losses.values<double>()[0],
              std::log(std::exp(1) + std::exp(2) + std::exp(3)) - 3, 1e-12);
  EXPECT_NEAR(result.losses.values<double>()[1], std::log(2 + std::exp(5)), 1e-12);
  EXPECT_EQ(result.correct, 1);
  for (int r = 0; r < 2; ++r) {
    double row = 0;
    for (int c = 0; c < 3; ++c)
      row += result.grad_logits.values<float>()[static_cast<std::size_t>(r * 3 + c)];
    EXPECT_NEAR(row, 0.0, 1e-6);
  }
  EXPECT_THROW(softmax_cross_entropy(logits, std::vector<std::int32_t>{3, 0}), InvalidArgument);
}

TEST(Optimizers, AdamWFollowsTheReferenceUpdate) {
  Tensor w = Tensor::from_values(Shape{2}, DType::f32, std::vector<double>{1.0, -2.0});
  Tensor g = Tensor::from_values(Shape{2}, DType::f32, std::vector<double>{0.5, 0.25});
  AdamW adam({{w, g}}, 0.1);
  adam.step(0.01);
  adam.step(0.01);
  // Reference in double, two steps.
  double ref[2] = {1.0, -2.0};
  double m[2] = {0, 0}, v[2] = {0, 0};
  const double grads[2] = {0.5, 0.25};
  for (int t = 1; t <= 2; ++t) {
    for (int i = 0; i < 2; ++i) {
      ref[i] *= 1 - 0.01 * 0.1;
      m[i] = 0.9 * m[i] + 0.1 * grads[i];
      v[i] = 0.999 * v[i] + 0.001 * grads[i] * grads[i];
      const double mhat = m[i] / (1 - std::pow(0.9, t));
      const double vhat = v[i] / (1 - std::pow(0.999, t));
      ref[i] -= 0.01 * mhat / (std::sqrt(vhat) + 1e-8);
    }
  }
  EXPECT_NEAR(w.values<float>()[0], ref[0], 1e-6);
  EXPECT_NEAR(w.values<float>()[1], ref[1], 1e-6);
}

// A copy of the state (values, per-slot tensors, scalars) continues with the same bits, which is
// what a checkpoint resume relies on.
template <class MakeOptimizer>
void expect_state_copy_continues_bitwise(MakeOptimizer make) {
  const Tensor g = Tensor::random_normal(Shape{5}, DType::f32, 8);
  Tensor w1 = Tensor::random_normal(Shape{5}, DType::f32, 9);
  auto first = make(w1, g);
  for (int i = 0; i < 3; ++i)
    first->step(0.01 * (i + 1));
  Tensor w2 = w1.clone();
  auto second = make(w2, g);
  const auto from = first->slot_state(0);
  auto into = second->slot_state(0);
  ASSERT_EQ(from.size(), into.size());
  for (std::size_t k = 0; k < from.size(); ++k) {
    EXPECT_EQ(from[k].first, into[k].first);
    into[k].second.copy_from(from[k].second);
  }
  second->set_scalar_state(first->scalar_state());
  EXPECT_EQ(second->steps(), 3);
  first->step(0.02);
  second->step(0.02);
  EXPECT_TRUE(w1.bitwise_equal(w2));
}

TEST(Optimizers, StateCopiesContinueBitwise) {
  expect_state_copy_continues_bitwise([](Tensor& w, const Tensor& g) {
    return std::make_unique<AdamW>(std::vector<OptimizerSlot>{{w, g}}, 0.1);
  });
  expect_state_copy_continues_bitwise([](Tensor& w, const Tensor& g) {
    return std::make_unique<SGD>(std::vector<OptimizerSlot>{{w, g}}, 0.9, 0.01);
  });
  Tensor w = Tensor::zeros(Shape{1}, DType::f32);
  AdamW adam({{w, w.clone()}}, 0.0);
  EXPECT_EQ(adam.slot_state(0).front().first, "exp_avg");
  try {
    adam.set_scalar_state({{"step", 2.0}, {"beta1_power", 0.5}});
    FAIL() << "a missing scalar was accepted";
  } catch (const InvalidArgument& error) {
    EXPECT_NE(std::string(error.what()).find("'beta2_power' is missing"), std::string::npos);
  }
  EXPECT_EQ(adam.steps(), 0);  // nothing was set
}

TEST(Optimizers, SgdWithMomentumAndWeightDecay) {
  Tensor w = Tensor::from_values(Shape{1}, DType::f32, std::vector<double>{1.0});
  Tensor g = Tensor::from_values(Shape{1}, DType::f32, std::vector<double>{0.5});
  SGD sgd({{w, g}}, 0.9, 0.1);
  sgd.step(0.1);  // g' = 0.6, buf = 0.6, w = 0.94
  EXPECT_FLOAT_EQ(w.values<float>()[0], 0.94f);
  sgd.step(0.1);  // g' = 0.594, buf = 0.54 + 0.594 = 1.134, w = 0.94 - 0.1134
  EXPECT_NEAR(w.values<float>()[0], 0.8266, 1e-6);
}

TEST(Optimizers, ScheduleWarmsUpThenDecaysToZero) {
  LrSchedule schedule{LrSchedule::Kind::cosine, 1.0, 10, 110};
  EXPECT_DOUBLE_EQ(schedule.at(0), 0.1);
  EXPECT_DOUBLE_EQ(schedule.at(9), 1.0);
  EXPECT_DOUBLE_EQ(schedule.at(10), 1.0);
  EXPECT_NEAR(schedule.at(60), 0.5, 1e-12);
  EXPECT_NEAR(schedule.at(110), 0.0, 1e-12);
  LrSchedule constant{LrSchedule::Kind::constant, 0.3, 0, 5};
  EXPECT_DOUBLE_EQ(constant.at(4), 0.3);
}

TEST(Mlp, TheSameSeedGivesTheSameBitsAndAnotherSeedOthers) {
  MlpConfig config;
  config.hidden = {32, 16};
  config.seed = 5;
  const auto a = make_mlp(config);
  const auto b = make_mlp(config);
  EXPECT_EQ(parameters_digest(a->parameters()), parameters_digest(b->parameters()));
  config.seed = 6;
  EXPECT_NE(parameters_digest(a->parameters()), parameters_digest(make_mlp(config)->parameters()));
  EXPECT_EQ(a->describe(),
            "Sequential(Linear(784, 32), ReLU, Linear(32, 16), ReLU, Linear(16, 10))");
}

TEST(Mlp, ModelSyntaxErrorsNameTheBadPart) {
  EXPECT_EQ(parse_mlp_hidden("mlp:1024,512"), (std::vector<std::int64_t>{1024, 512}));
  EXPECT_TRUE(parse_mlp_hidden("mlp:").empty());
  for (const char* bad : {"cnn:3", "mlp:0", "mlp:-4", "mlp:12,,3", "mlp:1x"}) {
    EXPECT_THROW(parse_mlp_hidden(bad), ParseError) << bad;
  }
  EXPECT_THROW(parse_activation("tanh"), ParseError);
}

}  // namespace
}  // namespace meshtensor::nn
