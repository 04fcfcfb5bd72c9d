#include "hf/tensor_map.hpp"

#include <gtest/gtest.h>

#include <meshtensor/hf/hf_model.hpp>
#include <meshtensor/nn/models.hpp>

namespace meshtensor::hf {
namespace {

std::vector<nn::DecoderSpec> configs() {
  return {nn::parse_decoder_spec("gpt:layers=2,heads=2,dim=16,context=8,tie=1"),
          nn::parse_decoder_spec("llama:layers=2,heads=4,kv_heads=2,dim=16,ffn=32,context=8"),
          nn::parse_decoder_spec(
              "llama:layers=1,heads=4,kv_heads=1,dim=16,ffn=48,context=8,qk_norm=1,tie=1")};
}

TEST(HfTensorMap, EveryParameterAndAnyColumnBlockOfItComeBackBitForBit) {
  for (const nn::DecoderSpec& config : configs()) {
    const std::unique_ptr<nn::Decoder> model = nn::make_decoder(nn::with_seed(config, 7));
    const std::vector<Link> links = links_of(config);
    for (nn::Parameter* p : model->parameters()) {
      SCOPED_TRACE(p->name);
      EXPECT_EQ(parameter_shape(config, p->name), p->value.shape());
      const Shape shape = p->value.shape();
      // The whole parameter, and the block of the last rank of 2 that splits its last dim (a
      // column-parallel split), read from the Hugging Face tensors.
      const std::int64_t columns = shape.dims().back();
      Shape half_extent = shape;
      std::vector<std::int64_t> half_offset(static_cast<std::size_t>(shape.rank()), 0);
      if (shape.rank() == 2) {
        half_extent = Shape{shape[0], columns - columns / 2};
        half_offset[1] = columns / 2;
      } else {
        half_extent = Shape{columns - columns / 2};
        half_offset[0] = columns / 2;
      }
      const Block whole{shape, {}, shape};
      const Block half{shape, half_offset, half_extent};
      Tensor back(shape, DType::f32);
      Tensor back_half(half_extent, DType::f32);
      int used = 0;
      for (const Link& link : links) {
        if (link.ours != p->name) continue;
        ++used;
        const Tensor hf = to_hf(config, link, p->value);
        const std::int64_t width = hf.shape().rank() == 2 ? hf.shape()[1] : 1;
        EXPECT_EQ(rows_read(config, link, whole).second - rows_read(config, link, whole).first,
                  hf.shape()[0]);
        block_from_rows(config, link, whole, hf.values<float>(), 0, width, back);
        const auto [first, end] = rows_read(config, link, half);
        if (first == end) continue;
        block_from_rows(config, link, half,
                        hf.values<float>().subspan(static_cast<std::size_t>(first * width)), first,
                        width, back_half);
      }
      EXPECT_GE(used, 1) << "no Hugging Face tensor holds it";
      const auto a = p->value.values<float>();
      const auto b = back.values<float>();
      EXPECT_TRUE(std::equal(a.begin(), a.end(), b.begin()));
      const Tensor expected =
          p->value.narrow(shape.rank() - 1, columns / 2, columns - columns / 2).contiguous();
      const auto c = expected.values<float>();
      const auto d = back_half.values<float>();
      EXPECT_TRUE(std::equal(c.begin(), c.end(), d.begin()));
    }
    // Each Hugging Face tensor comes from a parameter of the model.
    for (const Link& link : links) {
      bool found = false;
      for (nn::Parameter* p : model->parameters())
        found = found || p->name == link.ours;
      EXPECT_TRUE(found) << link.hf;
    }
  }
}

TEST(HfTensorMap, FusedProjectionsSplitIntoHuggingFacesTensors) {
  const nn::DecoderSpec config =
      nn::parse_decoder_spec("llama:layers=1,heads=4,kv_heads=2,dim=8,ffn=8,context=4");
  // qkv columns: group 0 = q0 q1 k0 v0, group 1 = q2 q3 k1 v1 (head_dim 2); row r, column c
  // holds 100 r + c.
  Tensor qkv(Shape{8, 16}, DType::f32);
  for (int r = 0; r < 8; ++r)
    for (int c = 0; c < 16; ++c)
      qkv.values<float>()[static_cast<std::size_t>(r * 16 + c)] = static_cast<float>(100 * r + c);
  const std::vector<Link> links = links_of(config);
  const auto link = [&](const std::string& hf) {
    return *std::find_if(links.begin(), links.end(), [&](const Link& l) { return l.hf == hf; });
  };
  const Tensor q = to_hf(config, link("model.layers.0.self_attn.q_proj.weight"), qkv);
  const Tensor k = to_hf(config, link("model.layers.0.self_attn.k_proj.weight"), qkv);
  EXPECT_EQ(q.shape(), (Shape{8, 8}));  // [out, in]
  EXPECT_EQ(k.shape(), (Shape{4, 8}));
  // q head 2 (HF rows 4, 5) is group 1's first query: our columns 8, 9.
  EXPECT_EQ(q.values<float>()[4 * 8 + 3], 100.0f * 3 + 8);
  // k head 1 (HF rows 2, 3) is group 1's key: our columns 12, 13.
  EXPECT_EQ(k.values<float>()[3 * 8 + 0], 13.0f);
}

TEST(HfModel, AnUntiedGptHasNoHuggingFaceClassAndSaysWhy) {
  try {
    architecture_of(nn::parse_decoder_spec("gpt:layers=1,heads=1,dim=8,context=4"));
    FAIL() << "exported an untied GPT";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("train the GPT with tie=1"), std::string::npos);
  }
  EXPECT_EQ(architecture_of(configs()[0]), "GPT2LMHeadModel");
  EXPECT_EQ(architecture_of(configs()[1]), "LlamaForCausalLM");
  EXPECT_EQ(architecture_of(configs()[2]), "Qwen3ForCausalLM");
}

TEST(HfModel, ConfigJsonReadsBackAsTheSameDecoder) {
  const tokenize::Tokenizer bytes = tokenize::Tokenizer::bytes();
  for (const nn::DecoderSpec& config : configs()) {
    const nlohmann::json json = config_json(config, bytes, DType::bf16);
    EXPECT_EQ(nn::decoder_spec_text(parse_config_json(json, "config.json")),
              nn::decoder_spec_text(config));
    EXPECT_EQ(json["torch_dtype"], "bfloat16");
  }
  nlohmann::json bad = config_json(configs()[1], bytes, DType::f32);
  bad["hidden_act"] = "gelu";
  EXPECT_THROW(parse_config_json(bad, "config.json"), DataError);
  bad = config_json(configs()[0], bytes, DType::f32);
  bad["layer_norm_epsilon"] = 1e-6;
  EXPECT_THROW(parse_config_json(bad, "config.json"), DataError);
}

}  // namespace
}  // namespace meshtensor::hf
