// The Llama family's layers: grouped-query attention with rotary embeddings (and QK-norm).
#include <cmath>
#include <vector>

#include <gtest/gtest.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/nn/gradients.hpp>
#include <meshtensor/nn/grouped_attention.hpp>
#include <meshtensor/nn/llama.hpp>
#include <meshtensor/nn/loss.hpp>
#include <meshtensor/nn/models.hpp>
#include <meshtensor/nn/optim.hpp>

#include "support/finite_differences.hpp"

namespace meshtensor::nn {
namespace {

GroupedAttentionConfig tiny(std::int64_t heads, std::int64_t kv_heads, bool qk_norm) {
  GroupedAttentionConfig config;
  config.dim = 4 * heads;
  config.heads = heads;
  config.kv_heads = kv_heads;
  config.context = 6;
  config.rope_theta = 100.0;
  config.qk_norm = qk_norm;
  return config;
}

TEST(GroupedQueryAttention, GradientsMatchFiniteDifferences) {
  for (const bool qk_norm : {false, true}) {
    for (const auto& [heads, kv_heads] : {std::pair{2, 1}, {4, 2}, {2, 2}}) {
      GroupedQueryAttention attention(tiny(heads, kv_heads, qk_norm), 11, 0.5, 0.5);
      check_gradients(attention, Tensor::random_normal(Shape{2, 5, 4 * heads}, DType::f32, 5), 2e-2,
                      3);
    }
  }
}

TEST(GroupedQueryAttention, EachPositionSeesOnlyItsPastAndNotItsBatch) {
  GroupedQueryAttention attention(tiny(4, 2, true), 3, 0.3, 0.3);
  const Tensor x = Tensor::random_normal(Shape{3, 6, 16}, DType::f32, 8);
  const Tensor all = attention.forward(x);
  // The second sequence alone: the same bits.
  const Tensor alone = attention.forward(x.narrow(0, 1, 1).contiguous());
  EXPECT_EQ(alone.digest(), all.narrow(0, 1, 1).contiguous().digest());
  // Its first four positions alone: the same bits (causal).
  const Tensor prefix = attention.forward(x.narrow(0, 1, 1).narrow(1, 0, 4).contiguous());
  EXPECT_EQ(prefix.digest(), all.narrow(0, 1, 1).narrow(1, 0, 4).contiguous().digest());
}

TEST(GroupedQueryAttention, DecodingFromAKeyValueCacheGivesTheForwardsBits) {
  GroupedQueryAttention attention(tiny(4, 2, true), 9, 0.3, 0.3);
  const Tensor a = Tensor::random_normal(Shape{1, 6, 16}, DType::f32, 1);
  const Tensor b = Tensor::random_normal(Shape{1, 6, 16}, DType::f32, 2);
  const Tensor whole_a = attention.forward(a);
  const Tensor whole_b = attention.forward(b);
  KeyValueCache cache(2, attention.local_groups(), attention.head_dim(), 6);
  {
    DecodeRows unreserved{{0}, {0}};  // a slot holds no position before it is reserved
    attention.set_decode(&unreserved, &cache);
    EXPECT_THROW(attention.forward(Tensor::random_normal(Shape{1, 1, 16}, DType::f32, 3)),
                 InvalidArgument);
    attention.set_decode(nullptr, nullptr);
  }
  cache.reserve(0, 6);
  cache.reserve(1, 6);
  // Chunks of a (slot 0) and b (slot 1) interleaved in the same calls.
  const auto decode = [&](std::int64_t from, std::int64_t to) {
    DecodeRows rows;
    std::vector<Tensor> pieces;
    for (std::int64_t p = from; p < to; ++p) {
      rows.slots.insert(rows.slots.end(), {0, 1});
      rows.positions.insert(rows.positions.end(), {p, p});
    }
    Tensor input = Tensor::uninitialized(Shape{1, rows.size(), 16}, DType::f32);
    for (std::int64_t r = 0; r < rows.size(); ++r) {
      const Tensor& source = r % 2 == 0 ? a : b;
      std::copy_n(source.values<float>().data() + rows.positions[static_cast<std::size_t>(r)] * 16,
                  16, input.values<float>().data() + r * 16);
    }
    attention.set_decode(&rows, &cache);
    const Tensor out = attention.forward(input);
    attention.set_decode(nullptr, nullptr);
    for (std::int64_t r = 0; r < rows.size(); ++r) {
      const Tensor& whole = r % 2 == 0 ? whole_a : whole_b;
      const std::int64_t p = rows.positions[static_cast<std::size_t>(r)];
      for (std::int64_t d = 0; d < 16; ++d) {
        EXPECT_EQ(out.values<float>()[static_cast<std::size_t>(r * 16 + d)],
                  whole.values<float>()[static_cast<std::size_t>(p * 16 + d)])
            << "row " << r << " position " << p;
      }
    }
  };
  decode(0, 4);
  decode(4, 5);
  decode(5, 6);
  KeyValueCache wrong(2, 4, attention.head_dim(), 6);  // query heads, not key/value heads
  DecodeRows rows{{0}, {0}};
  EXPECT_THROW(attention.set_decode(&rows, &wrong), InvalidArgument);
}

TEST(GroupedQueryAttention, HoldsKeyValueHeadsNotQueryHeads) {
  GroupedQueryAttention gqa(tiny(4, 1, false), 1, 0.02, 0.02);
  // qkv: 4 query heads, 1 key and 1 value head of 4 values; no biases.
  EXPECT_EQ(gqa.parameters().size(), 2u);
  EXPECT_EQ(gqa.parameters()[0]->value.shape(), Shape({16, 24}));
  EXPECT_EQ(gqa.group_size(), 4);
  EXPECT_EQ(gqa.local_groups(), 1);
  GroupedQueryAttention normed(tiny(4, 2, true), 1, 0.02, 0.02);
  EXPECT_EQ(normed.parameters().size(), 4u);  // qkv, q_norm, k_norm, proj
}

TEST(GroupedQueryAttention, RefusesShapesThatDoNotSplit) {
  GroupedAttentionConfig config = tiny(4, 3, false);
  EXPECT_THROW(GroupedQueryAttention(config, 1, 0.02, 0.02), InvalidArgument);
  config = tiny(4, 2, false);
  config.dim = 12;  // head dim 3: no rotary pairs
  EXPECT_THROW(GroupedQueryAttention(config, 1, 0.02, 0.02), InvalidArgument);
  GroupedQueryAttention attention(tiny(2, 1, false), 1, 0.02, 0.02);
  EXPECT_THROW(attention.forward(Tensor::random_normal(Shape{1, 7, 8}, DType::f32, 1)),
               InvalidArgument);  // longer than the context
}

TEST(SwiGLU, PairsEachBlocksGateWithItsUpColumns) {
  SwiGLU gate(2);
  // One row, two blocks of (gate 2, up 2): [g0 g1 u0 u1 | g2 g3 u2 u3].
  const Tensor x =
      Tensor::from_values(Shape{1, 8}, DType::f32, std::vector<double>{1, -1, 2, 3, 0.5, 4, -2, 1});
  const Tensor y = gate.forward(x);
  ASSERT_EQ(y.shape(), Shape({1, 4}));
  const auto silu = [](double v) { return v / (1 + std::exp(-v)); };
  const std::vector<double> expected = {silu(1) * 2, silu(-1) * 3, silu(0.5) * -2, silu(4) * 1};
  for (std::size_t i = 0; i < expected.size(); ++i)
    EXPECT_NEAR(y.values<float>()[i], expected[i], 1e-6);
  check_gradients(gate, Tensor::random_normal(Shape{2, 3, 8}, DType::f32, 4), 1e-2);
  EXPECT_THROW(gate.forward(Tensor::random_normal(Shape{1, 6}, DType::f32, 1)), InvalidArgument);
}

DecoderSpec tiny_llama(bool qk_norm) {
  DecoderSpec config;
  config.layers = 2;
  config.heads = 2;
  config.kv_heads = 1;
  config.dim = 8;
  config.ffn = 12;
  config.context = 6;
  config.rope_theta = 500.0;
  config.qk_norm = qk_norm;
  config.init_std = 0.4;
  return config;
}

TEST(DecoderBlock, GradientsMatchFiniteDifferences) {
  for (const bool qk_norm : {false, true}) {
    DecoderBlock block(tiny_llama(qk_norm), 21);
    check_gradients(block, Tensor::random_normal(Shape{2, 4, 8}, DType::f32, 6), 3e-2, 3);
  }
}

TEST(DecoderBlock, ExactBlocksGiveTheSameValuesAndNoBiases) {
  DecoderBlock block(tiny_llama(true), 5);
  for (const Parameter* p : block.parameters())
    EXPECT_EQ(p->name.find("bias"), std::string::npos) << p->name;
  const Tensor x = Tensor::random_normal(Shape{2, 5, 8}, DType::f32, 7);
  const Tensor ordered = block.forward(x);
  block.set_exact_blocks(true);
  const Tensor exact = block.forward(x);
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    EXPECT_NEAR(exact.values<float>()[static_cast<std::size_t>(i)],
                ordered.values<float>()[static_cast<std::size_t>(i)], 1e-5);
  }
  DecoderSpec uneven = tiny_llama(false);
  uneven.ffn = 9;  // an odd width over 2 heads: one MLP block (gcd(9, 2))
  EXPECT_EQ(decoder_mlp_blocks(uneven), 1);
  EXPECT_EQ(DecoderBlock(uneven, 1).forward(x).shape(), x.shape());
  uneven.ffn = 0;
  EXPECT_THROW(DecoderBlock(uneven, 1), InvalidArgument);
}

/// Published shapes: heads wider than dim / heads (Qwen3), biases on q, k, v and the output
/// (Qwen2, a Llama's attention_bias), on the MLP (mlp_bias), and llama3-rescaled rotations.
TEST(DecoderBlock, PublishedShapesHaveTheirGradientsAndParameters) {
  DecoderSpec config = tiny_llama(true);
  config.head_dim = 6;
  config.qkv_bias = true;
  config.out_bias = true;
  config.mlp_bias = true;
  config.rope_scaling = {kernels::RotaryScaling::Kind::llama3, 8.0, 1.0, 4.0, 4};
  DecoderBlock block(config, 3);
  std::int64_t biases = 0;
  for (const Parameter* p : block.parameters())
    biases += p->name.ends_with("bias") ? p->value.numel() : 0;
  EXPECT_EQ(biases, (2 + 2 * 1) * 6 + 8 + 2 * 12 + 8);  // qkv, proj, gate_up, down
  // Biases start at zero: make them count in the gradient check.
  for (Parameter* p : block.parameters()) {
    if (!p->name.ends_with("bias")) continue;
    p->value = Tensor::random_normal(p->value.shape(), DType::f32, 9);
  }
  check_gradients(block, Tensor::random_normal(Shape{2, 4, 8}, DType::f32, 6), 3e-2, 3);
  config.layers = 1;
  config.vocabulary = 11;
  TransformerDecoder model(config);
  std::int64_t count = 0;
  for (const Parameter* p : model.parameters())
    count += p->value.numel();
  EXPECT_EQ(count, decoder_parameter_count(config));
  EXPECT_EQ(llama_config_text(parse_llama_config(llama_config_text(config))),
            llama_config_text(config));
  EXPECT_EQ(parse_llama_config(llama_config_text(config)).rope_scaling, config.rope_scaling);
}

TEST(Llama, ConfigTextRoundTripsAndBadShapesAreNamed) {
  const DecoderSpec config = parse_llama_config(
      "llama:layers=2,heads=8,kv_heads=2,dim=64,ffn=96,rope_theta=500000,qk_norm=1");
  EXPECT_EQ(config.kv_heads, 2);
  EXPECT_EQ(config.rope_theta, 500000.0);
  EXPECT_TRUE(config.qk_norm);
  EXPECT_EQ(parse_llama_config(llama_config_text(config)).ffn, 96);
  EXPECT_EQ(llama_config_text(parse_llama_config(llama_config_text(config))),
            llama_config_text(config));
  const auto message = [](const std::string& text) {
    try {
      parse_llama_config(text);
    } catch (const ParseError& error) {
      return std::string(error.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message("llama:heads=4,kv_heads=3").find("3 kv_heads do not divide the 4 heads"),
            std::string::npos);
  EXPECT_NE(message("llama:heads=5,kv_heads=1,dim=24,ffn=100").find("dim 24 does not split"),
            std::string::npos);
  EXPECT_NE(message("llama:heads=4,dim=20").find("the head dim 5 is odd"), std::string::npos);
  EXPECT_NE(message("llama:heads=5,kv_heads=1,dim=24").find("give head_dim=N"), std::string::npos);
  EXPECT_EQ(parse_llama_config("llama:heads=5,kv_heads=1,dim=24,head_dim=8").head_dim, 8);
  EXPECT_NE(message("llama:rope_scaling=yarn:4").find("'yarn:4' is not linear:F"),
            std::string::npos);
  EXPECT_NE(message("llama:rope_scaling=llama3:8:4:1:8192").find("must be above"),
            std::string::npos);
  // The keys of published shapes are written only when set: older texts read back unchanged.
  EXPECT_EQ(llama_config_text(parse_llama_config("llama")).find("bias"), std::string::npos);
  EXPECT_NE(message("llama:layers=2,layers=3").find("twice"), std::string::npos);
  EXPECT_NE(message("llama:bias=1").find("'bias=1'"), std::string::npos);
  EXPECT_NE(message("llama:qk_norm=2").find("not true or false"), std::string::npos);
  EXPECT_TRUE(is_llama_model("llama"));
  EXPECT_FALSE(is_llama_model("gpt"));
}

DecoderSpec small_llama() {
  DecoderSpec config =
      parse_llama_config("llama:layers=2,heads=4,kv_heads=2,dim=16,ffn=24,context=8,qk_norm=1");
  config.vocabulary = 32;
  config.seed = 4;
  return config;
}

TEST(Llama, CountsItsParametersAndHasNoBiases) {
  TransformerDecoder model(small_llama());
  std::int64_t total = 0;
  for (const Parameter* p : model.parameters()) {
    total += p->value.numel();
    EXPECT_EQ(p->name.find("bias"), std::string::npos) << p->name;
  }
  EXPECT_EQ(total, decoder_parameter_count(small_llama()));
  EXPECT_EQ(model.units().size(), 4u);  // embed, 2 blocks, head
  // The default costs about what the default GPT does: 12·dim² a block.
  const DecoderSpec defaults;
  EXPECT_EQ(decoder_parameter_count(defaults) - 2 * 256 * 128 - 128,
            4 * (12 * 128 * 128 + 2 * 128));
}

TEST(Llama, DecodingGivesTheForwardsBitsAndTrainingLowersTheLoss) {
  TransformerDecoder model(small_llama());
  model.set_exact_sums(true);
  const Tensor tokens =
      Tensor::from_values(Shape{1, 8}, DType::i64, std::vector<double>{3, 1, 4, 1, 5, 9, 2, 6});
  const Tensor whole = model.forward(tokens);
  std::vector<KeyValueCache> caches = model.make_caches(1);
  reserve_slot(caches, 0, 8);
  ASSERT_EQ(caches.front().heads(), 2);  // key/value heads, not the 4 query heads
  for (std::int64_t p = 0; p < 8; ++p) {
    DecodeRows rows{{0}, {p}};
    const Tensor logits =
        model.decode(tokens.narrow(1, p, 1).contiguous().reshape(Shape{1}), rows, caches);
    for (std::int64_t v = 0; v < 32; ++v) {
      EXPECT_EQ(logits.values<float>()[static_cast<std::size_t>(v)],
                whole.values<float>()[static_cast<std::size_t>(p * 32 + v)])
          << "position " << p;
    }
  }
  // Next-token prediction of one sequence: a few AdamW steps lower the loss.
  std::vector<std::int32_t> labels = {1, 4, 1, 5, 9, 2, 6, 5};
  DenseGradients sink(model.parameters());
  AdamW optimizer(slots_of(model.parameters()), 0.0);
  double first = 0;
  double last = 0;
  for (int step = 0; step < 20; ++step) {
    sink.clear();
    const Tensor logits = model.forward(tokens);
    const CrossEntropyResult loss = softmax_cross_entropy(logits.reshape(Shape{8, 32}), labels);
    model.backward(loss.grad_logits.reshape(logits.shape()), sink, false);
    sink.finish(8);
    optimizer.step(1e-2);
    double total = 0;
    for (const double value : loss.losses.values<double>())
      total += value;
    (step == 0 ? first : last) = total;
  }
  EXPECT_LT(last, first * 0.5);
}

TEST(Decoder, BothFamiliesDecodeWithTheForwardsBitsThroughOneInterface) {
  for (const std::string text : {"gpt:layers=1,heads=2,dim=8,context=6",
                                 "llama:layers=2,heads=4,kv_heads=1,dim=16,ffn=8,context=6"}) {
    const DecoderSpec config = parse_decoder_spec(text);
    EXPECT_EQ(decoder_spec_text(parse_decoder_spec(decoder_spec_text(config))),
              decoder_spec_text(config));
    std::unique_ptr<Decoder> model = make_decoder(config);
    std::int64_t total = 0;
    for (const Parameter* p : model->parameters())
      total += p->value.numel();
    EXPECT_EQ(total, decoder_parameter_count(config)) << text;
    model->set_exact_sums(true);
    EXPECT_TRUE(model->exact_sums());
    const Tensor tokens =
        Tensor::from_values(Shape{1, 6}, DType::i64, std::vector<double>{7, 0, 255, 3, 3, 9});
    const Tensor whole = model->forward(tokens);
    std::vector<KeyValueCache> caches = model->make_caches(2);
    reserve_slot(caches, 1, 6);
    DecodeRows rows{{1, 1, 1, 1, 1, 1}, {0, 1, 2, 3, 4, 5}};
    const Tensor decoded = model->decode(tokens.reshape(Shape{6}), rows, caches);
    EXPECT_EQ(decoded.digest(), whole.reshape(Shape{6, model->vocabulary()}).digest()) << text;
    EXPECT_EQ(model->context(), 6);
  }
  EXPECT_THROW(parse_decoder_spec("mlp:16"), ParseError);
}

/// A DecoderHead tied to a table this module owns: its gradient check covers the table's.
class TiedHeadProbe : public Module {
 public:
  explicit TiedHeadProbe(const DecoderSpec& config)
      : table_(make_table(config)), head_(config, 3, &table_) {}
  Tensor forward(const Tensor& input) override { return head_.forward(input); }
  Tensor backward(const Tensor& grad_output, GradientSink& sink, bool need_input_grad) override {
    return head_.backward(grad_output, sink, need_input_grad);
  }
  std::vector<Parameter*> parameters() override {
    std::vector<Parameter*> all{&table_};
    for (Parameter* p : head_.parameters())
      all.push_back(p);
    return all;
  }
  std::string describe() const override { return "TiedHeadProbe"; }

 private:
  static Parameter make_table(const DecoderSpec& config) {
    Parameter table;
    table.name = "table";
    table.value = Tensor::random_normal(Shape{config.vocabulary, config.dim}, DType::f32, 9);
    table.grad = Tensor(table.value.shape(), DType::f32);
    return table;
  }

  Parameter table_;
  DecoderHead head_;
};

TEST(Llama, ATiedHeadReadsTheTableAndSendsItsGradientThere) {
  DecoderSpec config = small_llama();
  config.tie = true;
  TiedHeadProbe probe(config);
  ASSERT_EQ(probe.parameters().size(), 2u);  // the table and the norm: the head owns no weight
  check_gradients(probe, Tensor::random_normal(Shape{2, 3, 16}, DType::f32, 5), 2e-2);

  TransformerDecoder tied(config);
  EXPECT_EQ(decoder_parameter_count(config), decoder_parameter_count(small_llama()) - 16 * 32);
  std::int64_t total = 0;
  for (const Parameter* p : tied.parameters())
    total += p->value.numel();
  EXPECT_EQ(total, decoder_parameter_count(config));
  const auto groups = tied.parameter_groups();
  ASSERT_EQ(groups.size(), 3u);  // {embed, head}, then each block
  EXPECT_EQ(groups.front().size(), 2u);
  EXPECT_EQ(parse_llama_config(llama_config_text(config)).tie, true);
}

TEST(Decoder, ArchitectureTextsRoundTripAndOtherModelsAreNamed) {
  DecoderSpec llama = small_llama();
  llama.vocabulary = 256;
  llama.tie = true;
  for (const DecoderSpec& config : {gpt_spec(GptConfig{}), llama}) {
    const std::string text = decoder_architecture_text(config);
    EXPECT_EQ(decoder_architecture_text(parse_decoder_architecture(text)), text);
    EXPECT_EQ(text.rfind(decoder_family_name(config) + " ", 0), 0u) << text;
  }
  EXPECT_THROW(
      {
        try {
          parse_decoder_architecture("mlp hidden=16 activation=relu layernorm=no");
        } catch (const DataError& e) {
          EXPECT_NE(std::string(e.what()).find("its family 'mlp' is neither gpt nor llama"),
                    std::string::npos)
              << e.what();
          throw;
        }
      },
      DataError);
  const std::string words = decoder_architecture_text(llama);
  // The tokenizer is named, not judged here: generate::architecture_problem checks it.
  EXPECT_EQ(architecture_tokenizer(words), "bytes");
  EXPECT_EQ(architecture_tokenizer(decoder_architecture_text(llama, "bpe:0123456789abcdef")),
            "bpe:0123456789abcdef");
  EXPECT_THROW(parse_decoder_architecture(words.substr(0, words.find(" tokenizer"))), DataError);
  EXPECT_THROW(parse_decoder_architecture("llama layers=2 heads=3 kv_heads=2 vocabulary=256 "
                                          "tokenizer=bytes"),
               DataError);  // 2 key/value heads do not divide 3 heads
}

}  // namespace
}  // namespace meshtensor::nn
