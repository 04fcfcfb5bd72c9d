// The one described decoder: a family is a preset of the spec, the kinds combine freely, and
// what derives from the spec (parameter count, caches) matches what the model builds.
#include <algorithm>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/nn/gpt.hpp>
#include <meshtensor/nn/models.hpp>
#include <meshtensor/nn/transformer.hpp>

#include "support/finite_differences.hpp"

namespace meshtensor::nn {
namespace {

std::int64_t parameters_built(Decoder& model) {
  std::int64_t total = 0;
  for (const Parameter* p : model.parameters())
    total += p->value.numel();
  return total;
}

Tensor tokens(std::int64_t length) {
  std::vector<double> ids;
  for (std::int64_t i = 0; i < length; ++i)
    ids.push_back(static_cast<double>((7 * i + 3) % 29));
  return Tensor::from_values(Shape{1, length}, DType::i64, ids);
}

TEST(DecoderSpec, AGptIsThePresetOfTheOneDecoder) {
  GptConfig config;
  config.layers = 2;
  config.heads = 4;
  config.dim = 16;
  config.context = 8;
  config.vocabulary = 29;
  config.seed = 5;
  const DecoderSpec spec = gpt_spec(config);
  EXPECT_EQ(spec.kv_heads, 4);
  EXPECT_EQ(spec.ffn, 64);
  EXPECT_EQ(spec.positions, PositionKind::learned);
  EXPECT_EQ(gpt_config_of(spec).dim, 16);
  EXPECT_EQ(decoder_spec_text(spec), "gpt:layers=2,heads=4,dim=16,context=8");
  Gpt gpt(config);
  TransformerDecoder described(spec);
  EXPECT_EQ(parameters_built(gpt), decoder_parameter_count(spec));
  EXPECT_EQ(parameters_built(gpt), gpt_parameter_count(config));
  const std::vector<Parameter*> a = gpt.parameters();
  const std::vector<Parameter*> b = described.parameters();
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i]->name, b[i]->name);
    EXPECT_TRUE(a[i]->value.bitwise_equal(b[i]->value)) << a[i]->name;
  }
  EXPECT_TRUE(gpt.forward(tokens(8)).bitwise_equal(described.forward(tokens(8))));
  // A spec that leaves the preset is not a GPT's text.
  DecoderSpec rotary = spec;
  rotary.positions = PositionKind::rotary;
  EXPECT_THROW(gpt_config_of(rotary), InvalidArgument);
}

/// LayerNorm with rotary positions, a GELU MLP, grouped heads of their own width, QK-norm and a
/// head bias: a combination no preset names.
DecoderSpec mixed_spec() {
  DecoderSpec spec;
  spec.layers = 2;
  spec.heads = 4;
  spec.kv_heads = 2;
  spec.dim = 12;
  spec.head_dim = 4;
  spec.ffn = 20;
  spec.context = 8;
  spec.vocabulary = 29;
  spec.norm = NormKind::layer_norm;
  spec.mlp = MlpKind::gelu;
  spec.qk_norm = true;
  spec.qkv_bias = true;
  spec.head_bias = true;
  spec.init_std = 0.3;
  return spec;
}

TEST(DecoderSpec, KindsCombineAndWhatDerivesMatchesWhatIsBuilt) {
  const DecoderSpec spec = mixed_spec();
  EXPECT_EQ(decoder_spec_problem(spec), "");
  TransformerDecoder model(spec);
  EXPECT_EQ(parameters_built(model), decoder_parameter_count(spec));
  std::vector<std::string> names;
  for (const Parameter* p : model.parameters())
    names.push_back(p->name);
  for (const char* name : {"blocks.1.mlp.fc.weight", "blocks.0.norm1.bias", "head.output.bias",
                           "blocks.0.attn.q_norm.weight", "embed.token.weight"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), name), names.end()) << name;
  }
  // Caches hold the key/value heads of head_dim; decoding gives the forward's bits.
  const Tensor whole = model.forward(tokens(6));
  std::vector<KeyValueCache> caches = model.make_caches(1);
  EXPECT_EQ(caches.front().heads(), 2);
  EXPECT_EQ(caches.front().head_dim(), 4);
  reserve_slot(caches, 0, 6);
  for (std::int64_t p = 0; p < 6; ++p) {
    const Tensor logits = model.decode(tokens(6).narrow(1, p, 1).contiguous().reshape(Shape{1}),
                                       DecodeRows{{0}, {p}}, caches);
    for (std::int64_t v = 0; v < 29; ++v) {
      EXPECT_EQ(logits.values<float>()[static_cast<std::size_t>(v)],
                whole.values<float>()[static_cast<std::size_t>(p * 29 + v)]);
    }
  }
  DecoderBlock block(spec, 3);
  check_gradients(block, Tensor::random_normal(Shape{2, 5, 12}, DType::f32, 6), 3e-2, 3);
}

TEST(DecoderSpec, ShapeProblemsAreNamed) {
  DecoderSpec spec = mixed_spec();
  spec.kv_heads = 3;
  EXPECT_NE(decoder_spec_problem(spec).find("3 kv_heads do not divide the 4 heads"),
            std::string::npos);
  EXPECT_THROW(TransformerDecoder{spec}, InvalidArgument);
  spec = mixed_spec();
  spec.head_dim = 3;
  EXPECT_NE(decoder_spec_problem(spec).find("head dim 3 is odd"), std::string::npos);
  spec.positions = PositionKind::learned;  // without rotations a head may be of any width
  EXPECT_EQ(decoder_spec_problem(spec), "");
  spec.head_dim = 0;
  spec.dim = 10;
  EXPECT_NE(decoder_spec_problem(spec).find("dim 10 does not split into 4 heads"),
            std::string::npos);
}

}  // namespace
}  // namespace meshtensor::nn
