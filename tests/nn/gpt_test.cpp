#include <bit>
#include <cmath>
#include <functional>
#include <set>
#include <span>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/core/random.hpp>
#include <meshtensor/kernels/activation.hpp>
#include <meshtensor/kernels/simd.hpp>
#include <meshtensor/nn/gpt.hpp>
#include <meshtensor/nn/gradients.hpp>

#include "support/exact_sum_reference.hpp"
#include "support/tiny_gpt.hpp"

namespace meshtensor::nn {
namespace {

GptConfig tiny_config() {
  return testing::tiny_gpt({.dim = 8, .context = 6, .vocabulary = 11, .seed = 5, .init_std = 0.4});
}

/// Token ids [batch, length] drawn from `seed`.
Tensor random_tokens(std::int64_t batch, std::int64_t length, std::int64_t vocabulary,
                     std::uint64_t seed) {
  Tensor tokens(Shape{batch, length}, DType::i64);
  auto t = tokens.values<std::int64_t>();
  for (std::size_t i = 0; i < t.size(); ++i)
    t[i] = uniform_int_sample(seed, i, 0, vocabulary - 1);
  return tokens;
}

/// Rows [first, first + count) of a [batch, ...] tensor, copied.
Tensor rows_of(const Tensor& t, std::int64_t first, std::int64_t count) {
  return t.narrow(0, first, count).contiguous();
}

TEST(GptConfig, ParsesAnySubsetOfKeysAndRefusesBadText) {
  const GptConfig defaults;
  EXPECT_EQ(parse_gpt_config("gpt").dim, defaults.dim);
  const GptConfig c = parse_gpt_config("gpt:dim=64,layers=2");
  EXPECT_EQ(c.dim, 64);
  EXPECT_EQ(c.layers, 2);
  EXPECT_EQ(c.heads, defaults.heads);
  EXPECT_EQ(c.context, defaults.context);
  EXPECT_EQ(gpt_config_text(parse_gpt_config(gpt_config_text(c))), gpt_config_text(c));
  EXPECT_TRUE(is_gpt_model("gpt") && is_gpt_model("gpt:dim=8") && is_gpt_model(gpt_config_text(c)));
  EXPECT_FALSE(is_gpt_model("gptx") || is_gpt_model("mlp:64") || is_gpt_model(""));
  for (const char* bad : {"gpt:", "gpt:depth=2", "gpt:dim=0", "gpt:dim=abc", "gpt:dim=64,dim=32",
                          "gpt:heads=3", "gpt:layers=99999", "gpt;dim=8", "gpx", "gpt:dim"}) {
    EXPECT_THROW(parse_gpt_config(bad), ParseError) << bad;
  }
}

TEST(Gpt, ParameterCountMatchesTheModel) {
  for (const GptConfig& config : {tiny_config(), GptConfig{}}) {
    Gpt model(config);
    EXPECT_EQ(parameter_count(model.parameters()), gpt_parameter_count(config));
  }
}

TEST(Gpt, RejectsTokensOutsideTheVocabularyAndSequencesLongerThanTheContext) {
  Gpt model(tiny_config());
  Tensor tokens = random_tokens(1, 3, 11, 1);
  tokens.values<std::int64_t>()[1] = 11;
  EXPECT_THROW(model.forward(tokens), InvalidArgument);
  EXPECT_THROW(model.forward(random_tokens(1, 7, 11, 1)), InvalidArgument);
}

/// sum(logits · g) in f64: its gradient with respect to the logits is g.
double objective(Gpt& model, const Tensor& tokens, const Tensor& g) {
  const Tensor logits = model.forward(tokens);
  double total = 0.0;
  for (std::size_t i = 0; i < static_cast<std::size_t>(logits.numel()); ++i)
    total += static_cast<double>(logits.values<float>()[i]) * g.values<float>()[i];
  return total;
}

TEST(Gpt, BackwardMatchesCentralDifferencesForEveryParameter) {
  Gpt model(tiny_config());
  const Tensor tokens = random_tokens(2, 5, 11, 3);
  const Tensor g = Tensor::random_normal(Shape{2, 5, 11}, DType::f32, 9);
  DenseGradients sink(model.parameters());
  sink.clear();
  model.forward(tokens);
  model.backward(g, sink, false);
  sink.finish(1);
  const float h = 1e-2f;
  for (Parameter* p : model.parameters()) {
    double worst = 0.0;
    for (std::int64_t i = 0; i < p->value.numel(); ++i) {
      float& value = p->value.values<float>()[static_cast<std::size_t>(i)];
      const float saved = value;
      value = saved + h;
      const double up = objective(model, tokens, g);
      value = saved - h;
      const double down = objective(model, tokens, g);
      value = saved;
      const double numeric = (up - down) / (2 * h);
      const double analytic = p->grad.values<float>()[static_cast<std::size_t>(i)];
      worst = std::max(worst, std::fabs(numeric - analytic) / (1.0 + std::fabs(numeric)));
    }
    EXPECT_LT(worst, 2e-2) << p->name;
  }
}

TEST(Gpt, LogitsOfAPositionDependOnlyOnTheTokensUpToIt) {
  Gpt model(tiny_config());
  const Tensor tokens = random_tokens(1, 6, 11, 4);
  const Tensor logits = model.forward(tokens);
  Tensor changed = tokens.clone();
  changed.values<std::int64_t>()[4] = (changed.values<std::int64_t>()[4] + 1) % 11;
  const Tensor other = model.forward(changed);
  EXPECT_TRUE(rows_of(logits.reshape(Shape{6, 11}), 0, 4)
                  .bitwise_equal(rows_of(other.reshape(Shape{6, 11}), 0, 4)));
  EXPECT_FALSE(rows_of(logits.reshape(Shape{6, 11}), 4, 2)
                   .bitwise_equal(rows_of(other.reshape(Shape{6, 11}), 4, 2)));
}

/// A sequence's logits are the same bits alone and at every position of batches of 1, 3 and 16,
/// on every SIMD level and from several threads at once.
TEST(Gpt, ASequencesLogitsNeverDependOnTheBatch) {
  GptConfig config = tiny_config();
  config.context = 9;
  Gpt model(config);
  const Tensor sequence = random_tokens(1, 9, 11, 21);
  const Tensor alone = model.forward(sequence);
  for (const std::int64_t batch : {1, 3, 16}) {
    for (std::int64_t position = 0; position < batch; ++position) {
      Tensor tokens = random_tokens(batch, 9, 11, 100 + static_cast<std::uint64_t>(batch));
      tokens.narrow(0, position, 1).copy_from(sequence);
      const Tensor logits = model.forward(tokens);
      EXPECT_TRUE(rows_of(logits, position, 1).bitwise_equal(alone))
          << "batch " << batch << " position " << position;
    }
  }
  for (const auto level :
       {kernels::SimdLevel::baseline, kernels::SimdLevel::avx2, kernels::SimdLevel::avx512}) {
    if (static_cast<int>(level) > static_cast<int>(kernels::best_simd_level())) continue;
    kernels::set_simd_level(level);
    EXPECT_TRUE(model.forward(sequence).bitwise_equal(alone)) << kernels::simd_level_name(level);
  }
  kernels::set_simd_level(kernels::best_simd_level());
  std::vector<Tensor> results(4);
  std::vector<std::thread> threads;
  for (std::size_t t = 0; t < results.size(); ++t) {
    threads.emplace_back([&, t] {
      Gpt copy(config);  // same config: same weights
      Tensor tokens = random_tokens(3, 9, 11, 200 + t);
      tokens.narrow(0, 1, 1).copy_from(sequence);
      results[t] = rows_of(copy.forward(tokens), 1, 1);
    });
  }
  for (auto& thread : threads)
    thread.join();
  for (const Tensor& r : results)
    EXPECT_TRUE(r.bitwise_equal(alone));
}

/// Records every sum a backward asks for, so a test can form it independently.
class RecordingSink : public GradientSink {
 public:
  struct Call {
    const Parameter* p;
    int kind;  // 0 outer, 1 column sums, 2 column products, 3 indexed rows, 4 per-sample outer
    Tensor a, b;
    std::vector<std::int64_t> indices;
    std::int64_t sample_rows = 1;
  };
  void add_outer_products(const Parameter& p, const Tensor& x, const Tensor& dy) override {
    calls.push_back({&p, 0, x.contiguous(), dy.contiguous(), {}});
  }
  void add_sample_outer_products(const Parameter& p, const Tensor& x, const Tensor& dy,
                                 std::int64_t sample_rows) override {
    calls.push_back({&p, 4, x.contiguous(), dy.contiguous(), {}, sample_rows});
  }
  void add_column_sums(const Parameter& p, const Tensor& a) override {
    calls.push_back({&p, 1, a.contiguous(), {}, {}});
  }
  void add_column_products(const Parameter& p, const Tensor& a, const Tensor& b) override {
    calls.push_back({&p, 2, a.contiguous(), b.contiguous(), {}});
  }
  void add_indexed_rows(const Parameter& p, std::span<const std::int64_t> indices,
                        const Tensor& rows) override {
    calls.push_back({&p, 3, rows.contiguous(), {}, {indices.begin(), indices.end()}});
  }
  std::vector<Call> calls;
};

/// Per-sample outer products: each sample's x^T dy element as one f32 chain of fused
/// multiply-adds over the sample's rows in ascending order (matmul's contract), then exactly.
void add_sample_reference(const RecordingSink::Call& call,
                          std::vector<testing::ExactSumReference>& ref) {
  const std::int64_t rows = call.a.shape()[0];
  const std::int64_t n = call.a.shape()[1];
  const std::int64_t m = call.b.shape()[1];
  const auto x = call.a.values<float>();
  const auto dy = call.b.values<float>();
  for (std::int64_t first = 0; first < rows; first += call.sample_rows) {
    for (std::int64_t j = 0; j < n; ++j) {
      for (std::int64_t k = 0; k < m; ++k) {
        float chain = 0.0f;
        for (std::int64_t r = first; r < first + call.sample_rows; ++r)
          chain = std::fma(x[static_cast<std::size_t>(r * n + j)],
                           dy[static_cast<std::size_t>(r * m + k)], chain);
        ref[static_cast<std::size_t>(j * m + k)].add(chain);
      }
    }
  }
}

/// Adds the addends of one recorded call to the references of its parameter's elements.
void add_reference(const RecordingSink::Call& call, std::vector<testing::ExactSumReference>& ref) {
  if (call.kind == 4) return add_sample_reference(call, ref);
  const std::int64_t rows = call.a.shape()[0];
  const auto a = call.a.values<float>();
  const std::int64_t n = call.a.shape()[1];
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t j = 0; j < n; ++j) {
      const double value = a[static_cast<std::size_t>(r * n + j)];
      switch (call.kind) {
        case 0: {
          const std::int64_t m = call.b.shape()[1];
          for (std::int64_t k = 0; k < m; ++k)
            ref[static_cast<std::size_t>(j * m + k)].add(
                value * call.b.values<float>()[static_cast<std::size_t>(r * m + k)]);
          break;
        }
        case 1:
          ref[static_cast<std::size_t>(j)].add(value);
          break;
        case 2:
          ref[static_cast<std::size_t>(j)].add(
              value * call.b.values<float>()[static_cast<std::size_t>(r * n + j)]);
          break;
        default:
          ref[static_cast<std::size_t>(call.indices[static_cast<std::size_t>(r)] * n + j)].add(
              value);
      }
    }
  }
}

/// Every parameter kind's exact gradient (matrices, biases, LayerNorm scales, embedding tables
/// whose rows repeat) is the correctly rounded sum of the addends the backward reported, summed
/// independently in wide integers; a matrix's addends are its per-sample products.
TEST(Gpt, ExactGradientsAreTheCorrectlyRoundedSumsOfEveryParameterKind) {
  GptConfig config = tiny_config();
  config.vocabulary = 5;  // tokens repeat within and across sequences
  Gpt model(config);
  const Tensor tokens = random_tokens(3, 6, 5, 8);
  const Tensor g = Tensor::random_normal(Shape{3, 6, 5}, DType::f32, 10);
  RecordingSink recorder;
  model.forward(tokens);
  model.backward(g, recorder, false);
  BinnedGradients binned(model.parameters());
  binned.clear();
  model.forward(tokens);
  model.backward(g, binned, false);
  const std::int64_t divisor = 18;
  binned.finish(divisor);
  std::set<int> kinds;
  for (Parameter* p : model.parameters()) {
    std::vector<testing::ExactSumReference> ref(static_cast<std::size_t>(p->value.numel()));
    for (const auto& call : recorder.calls) {
      if (call.p != p) continue;
      kinds.insert(call.kind);
      add_reference(call, ref);
    }
    for (std::size_t i = 0; i < ref.size(); ++i) {
      const auto expected = static_cast<std::uint32_t>(ref[i].rounded(8, 23, divisor));
      ASSERT_EQ(std::bit_cast<std::uint32_t>(p->grad.values<float>()[i]), expected)
          << p->name << " element " << i;
    }
  }
  EXPECT_EQ(kinds, (std::set<int>{1, 2, 3, 4}));
}

/// In exact mode, the gradient of a batch is the same bits whatever the order of its sequences
/// and however it is split into pieces.
TEST(Gpt, ExactGradientsDoNotDependOnTheOrderOrSplitOfTheBatch) {
  Gpt model(tiny_config());
  const Tensor tokens = random_tokens(4, 6, 11, 12);
  const Tensor g = Tensor::random_normal(Shape{4, 6, 11}, DType::f32, 13);
  const auto gradients = [&](const std::vector<std::pair<std::int64_t, std::int64_t>>& pieces) {
    BinnedGradients sink(model.parameters());
    sink.clear();
    for (const auto& [first, count] : pieces) {
      model.forward(rows_of(tokens, first, count));
      model.backward(rows_of(g, first, count), sink, false);
    }
    sink.finish(24);
    std::vector<Tensor> out;
    for (Parameter* p : model.parameters())
      out.push_back(p->grad.clone());
    return out;
  };
  const std::vector<Tensor> whole = gradients({{0, 4}});
  for (const auto& pieces : std::vector<std::vector<std::pair<std::int64_t, std::int64_t>>>{
           {{3, 1}, {0, 3}}, {{1, 2}, {3, 1}, {0, 1}}, {{2, 1}, {1, 1}, {0, 1}, {3, 1}}}) {
    const std::vector<Tensor> split = gradients(pieces);
    for (std::size_t i = 0; i < whole.size(); ++i)
      EXPECT_TRUE(split[i].bitwise_equal(whole[i])) << model.parameters()[i]->name;
  }
}

TEST(Activation, ExpIsWithinTwoUlpAndGeluFollowsItsFormula) {
  for (int i = -8700; i <= 8800; ++i) {
    const float x = static_cast<float>(i) / 100.0f;
    const double exact = std::exp(static_cast<double>(x));
    const float got = kernels::exp_f32(x);
    EXPECT_LE(std::fabs(got - exact), 2.5 * std::ldexp(1.0, std::ilogb(exact) - 23)) << x;
  }
  std::vector<float> x(2001), y(2001), dx(2001), dy(2001, 1.0f);
  for (std::size_t i = 0; i < x.size(); ++i)
    x[i] = static_cast<float>(i) / 100.0f - 10.0f;
  kernels::gelu_forward(x.data(), y.data(), 2001);
  kernels::gelu_backward(x.data(), dy.data(), dx.data(), 2001);
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double v = x[i];
    const double t = std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v));
    EXPECT_NEAR(y[i], 0.5 * v * (1 + t), 1e-6 * (1 + std::fabs(v))) << v;
    const double inner = 0.7978845608028654 * (1 + 3 * 0.044715 * v * v);
    EXPECT_NEAR(dx[i], 0.5 * (1 + t) + 0.5 * v * (1 - t * t) * inner, 1e-5) << v;
  }
}

}  // namespace
}  // namespace meshtensor::nn

namespace meshtensor::nn {
namespace {

/// Incremental decoding through the key/value caches gives every position the logits bits of the
/// whole-sequence forward, in any interleaving of sequences and row chunks, in both sum modes.
TEST(GptDecode, RowsFromTheCacheHaveTheWholeSequenceBits) {
  for (const bool exact : {false, true}) {
    Gpt model(tiny_config());
    model.set_exact_sums(exact);
    const Tensor tokens = random_tokens(3, 6, 11, 21);
    const Tensor whole = model.forward(tokens);  // [3, 6, 11]
    std::vector<KeyValueCache> caches = model.make_caches(4);
    reserve_slot(caches, 0, 2);  // an unused slot of another size
    for (std::int64_t slot = 1; slot < 4; ++slot)
      reserve_slot(caches, slot, 6);
    // Sequence s lives in slot 3 - s; chunks of 1, 2 and 3 rows, sequences interleaved.
    const std::vector<std::vector<std::pair<std::int64_t, std::int64_t>>> calls{
        {{0, 0}, {2, 0}, {2, 1}},
        {{1, 0}, {1, 1}, {1, 2}, {0, 1}},
        {{0, 2}, {0, 3}, {2, 2}, {2, 3}, {2, 4}, {2, 5}},
        {{1, 3}, {1, 4}, {1, 5}, {0, 4}, {0, 5}}};
    for (const auto& call : calls) {
      DecodeRows rows;
      Tensor ids(Shape{static_cast<std::int64_t>(call.size())}, DType::i64);
      for (std::size_t r = 0; r < call.size(); ++r) {
        const auto [sequence, position] = call[r];
        rows.slots.push_back(3 - sequence);
        rows.positions.push_back(position);
        const std::int64_t at[] = {sequence, position};
        ids.values<std::int64_t>()[r] = static_cast<std::int64_t>(tokens.get(at));
      }
      const Tensor logits = model.decode(ids, rows, caches);
      for (std::size_t r = 0; r < call.size(); ++r) {
        const auto [sequence, position] = call[r];
        const Tensor want = whole.narrow(0, sequence, 1).narrow(1, position, 1).reshape(Shape{11});
        EXPECT_TRUE(logits.narrow(0, static_cast<std::int64_t>(r), 1)
                        .reshape(Shape{11})
                        .bitwise_equal(want.contiguous()))
            << "exact " << exact << " sequence " << sequence << " position " << position;
      }
    }
    // The whole-sequence forward still works after decoding.
    EXPECT_TRUE(model.forward(tokens).bitwise_equal(whole));
    DecodeRows bad{{4}, {0}};
    EXPECT_THROW(model.decode(Tensor(Shape{1}, DType::i64), bad, caches), InvalidArgument);
  }
}

}  // namespace
}  // namespace meshtensor::nn
