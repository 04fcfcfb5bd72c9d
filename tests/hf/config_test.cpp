#include <fmt/format.h>
#include <gtest/gtest.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/hf/hf_model.hpp>
#include <meshtensor/nn/models.hpp>

namespace meshtensor::hf {
namespace {

using Json = nlohmann::json;

Json small_llama(const std::string& architecture = "LlamaForCausalLM") {
  return {{"architectures", {architecture}}, {"hidden_size", 64},        {"intermediate_size", 128},
          {"num_hidden_layers", 2},          {"num_attention_heads", 4}, {"num_key_value_heads", 2},
          {"max_position_embeddings", 64},   {"head_dim", 16},           {"vocab_size", 300}};
}

Json small_gpt2() {
  return {{"architectures", {"GPT2LMHeadModel"}},
          {"model_type", "gpt2"},
          {"n_layer", 2},
          {"n_head", 4},
          {"n_embd", 64},
          {"n_positions", 64},
          {"vocab_size", 300}};
}

nn::DecoderSpec llama_of(const Json& config) {
  return parse_config_json(config, "config.json");
}

/// The message of the DataError that parsing `config` throws ("" when it parses).
std::string refusal(const Json& config) {
  try {
    parse_config_json(config, "config.json");
  } catch (const DataError& e) {
    return e.what();
  }
  return "";
}

TEST(HfConfig, RopeThetaIsReadFromTransformersFiveRopeParameters) {
  Json config = small_llama();
  config["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 500000.0}};
  EXPECT_EQ(llama_of(config).rope_theta, 500000.0);
  config["rope_theta"] = 500000.0;  // both spellings, agreeing
  EXPECT_EQ(llama_of(config).rope_theta, 500000.0);
  config.erase("rope_parameters");
  config["rope_scaling"] = {{"type", "default"}, {"rope_theta", 500000.0}};
  EXPECT_EQ(llama_of(config).rope_theta, 500000.0);
}

TEST(HfConfig, RopeSpellingsThatDisagreeOrAnotherTypeAreRefusedByName) {
  Json config = small_llama();
  config["rope_theta"] = 10000.0;
  config["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 500000.0}};
  EXPECT_NE(refusal(config).find("rope_parameters.rope_theta"), std::string::npos)
      << refusal(config);
  config.erase("rope_theta");
  config["rope_parameters"] = {{"rope_type", "llama3"}, {"rope_theta", 500000.0}, {"factor", 8}};
  EXPECT_NE(refusal(config).find("no low_freq_factor"), std::string::npos) << refusal(config);
  for (const char* type : {"yarn", "dynamic", "longrope", "su"}) {
    config["rope_parameters"] = {{"rope_type", type}, {"factor", 4}};
    EXPECT_NE(refusal(config).find(fmt::format("rope_type '{}'", type)), std::string::npos)
        << refusal(config);
  }
  config["rope_parameters"] = {{"rope_type", "linear"}, {"factor", 2}};
  config["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 4}};
  EXPECT_NE(refusal(config).find("rescales RoPE otherwise than rope_parameters"), std::string::npos)
      << refusal(config);
  config.erase("rope_scaling");
  config["rope_parameters"] = {{"rope_type", "default"}, {"partial_rotary_factor", 0.5}};
  EXPECT_NE(refusal(config).find("partial_rotary_factor"), std::string::npos);
}

TEST(HfConfig, AbsentKeysTakeTheirClassDefaults) {
  Json config = small_llama("Qwen3ForCausalLM");
  config.erase("head_dim");  // Qwen3Config's default is 128, not hidden_size / heads
  EXPECT_EQ(nn::decoder_head_dim(llama_of(config)), 128);
  config["hidden_size"] = 512;
  config["intermediate_size"] = 1024;
  EXPECT_EQ(llama_of(config).dim, 512);
  Json llama = small_llama();
  llama.erase("head_dim");             // DecoderSpec's default: hidden_size / heads
  llama.erase("num_key_value_heads");  // DecoderSpec's default: num_attention_heads
  llama.erase("vocab_size");
  const nn::DecoderSpec read = llama_of(llama);
  EXPECT_EQ(read.kv_heads, 4);
  EXPECT_EQ(read.vocabulary, 32000);
  EXPECT_EQ(read.rope_theta, 10000.0);
  EXPECT_EQ(read.norm_eps, 1e-6);
  EXPECT_FALSE(read.tie);
  Json gpt = small_gpt2();
  gpt.erase("vocab_size");
  EXPECT_EQ((parse_config_json(gpt, "config.json")).vocabulary, 50257);
}

/// Llama 3.2's, Qwen2.5's and Qwen3's configs as published (their keys, smaller sizes).
TEST(HfConfig, PublishedShapesAreRead) {
  Json llama32 = small_llama();
  llama32.update({{"rope_theta", 500000.0},
                  {"tie_word_embeddings", true},
                  {"max_position_embeddings", 131072},
                  {"rope_scaling",
                   {{"factor", 32.0},
                    {"high_freq_factor", 4.0},
                    {"low_freq_factor", 1.0},
                    {"original_max_position_embeddings", 8192},
                    {"rope_type", "llama3"}}},
                  {"attention_bias", false},
                  {"mlp_bias", false}});
  const nn::DecoderSpec a = llama_of(llama32);
  EXPECT_EQ(a.rope_scaling,
            (kernels::RotaryScaling{kernels::RotaryScaling::Kind::llama3, 32.0, 1.0, 4.0, 8192}));
  EXPECT_EQ(a.context, 131072);
  EXPECT_TRUE(a.tie);
  Json qwen25 = small_llama("Qwen2ForCausalLM");
  qwen25.erase("head_dim");
  qwen25.update({{"num_attention_heads", 14},
                 {"num_key_value_heads", 2},
                 {"hidden_size", 896},
                 {"intermediate_size", 4864},
                 {"sliding_window", 32768},
                 {"max_window_layers", 21},
                 {"use_sliding_window", false}});
  const nn::DecoderSpec b = llama_of(qwen25);
  EXPECT_TRUE(b.qkv_bias && !b.out_bias && !b.mlp_bias);
  EXPECT_EQ(nn::decoder_head_dim(b), 64);
  EXPECT_EQ(nn::decoder_mlp_blocks(b), 2);  // gcd(4864, 14)
  EXPECT_EQ(architecture_of(b), "Qwen2ForCausalLM");
  Json qwen3 = small_llama("Qwen3ForCausalLM");
  qwen3.update({{"head_dim", 32}, {"attention_bias", true}});  // heads 4 x 32 over a width of 64
  const nn::DecoderSpec c = llama_of(qwen3);
  EXPECT_EQ(nn::decoder_head_dim(c), 32);
  EXPECT_TRUE(c.qkv_bias && c.out_bias);
  EXPECT_EQ(architecture_of(c), "Qwen3ForCausalLM");
  Json smollm = small_llama();
  smollm.update({{"rope_interleaved", false}, {"is_llama_config", true}});
  EXPECT_EQ(refusal(smollm), "");
  smollm["rope_interleaved"] = true;
  EXPECT_NE(refusal(smollm).find("\"rope_interleaved\" is true"), std::string::npos)
      << refusal(smollm);
  Json biased = small_llama();
  biased.update({{"attention_bias", true}, {"mlp_bias", true}});
  const nn::DecoderSpec d = llama_of(biased);
  EXPECT_TRUE(d.qkv_bias && d.out_bias && d.mlp_bias);
  EXPECT_EQ(architecture_of(d), "LlamaForCausalLM");
  // Each class writes back what it read.
  for (const nn::DecoderSpec& config : {a, b, c, d}) {
    const Json written = config_json(config, tokenize::Tokenizer::bytes(), DType::f32);
    EXPECT_EQ(nn::llama_config_text(llama_of(written)), nn::llama_config_text(config));
  }
}

TEST(HfConfig, Qwen3SlidingWindowIsRefusedUnlessItCoversTheContext) {
  Json config = small_llama("Qwen3ForCausalLM");
  config["use_sliding_window"] = true;
  config["sliding_window"] = 16;
  config["max_window_layers"] = 0;
  EXPECT_NE(refusal(config).find("sliding window of 16 positions"), std::string::npos)
      << refusal(config);
  config["max_window_layers"] = 2;  // no layer at or past it: none slides
  EXPECT_EQ(refusal(config), "");
  config["max_window_layers"] = 1;
  EXPECT_NE(refusal(config), "");
  config["sliding_window"] = 64;  // covers the context
  EXPECT_EQ(refusal(config), "");
  config["sliding_window"] = 8;
  config["max_window_layers"] = 28;
  config["layer_types"] = {"full_attention", "sliding_attention"};
  EXPECT_NE(refusal(config).find("sliding window of 8"), std::string::npos) << refusal(config);
  config.erase("use_sliding_window");  // without it Qwen3Config nulls the window
  EXPECT_EQ(refusal(config), "");
  config["layer_types"] = {"full_attention", "chunked"};
  EXPECT_NE(refusal(config).find("chunked"), std::string::npos);
}

TEST(HfConfig, Gpt2FlagsThatChangeTheComputationAreRefusedByName) {
  for (const char* key : {"scale_attn_by_inverse_layer_idx", "add_cross_attention"}) {
    Json config = small_gpt2();
    config[key] = true;
    EXPECT_NE(refusal(config).find(key), std::string::npos) << key;
  }
  Json config = small_gpt2();
  config["scale_attn_weights"] = false;
  EXPECT_NE(refusal(config).find("scale_attn_weights"), std::string::npos);
  config = small_gpt2();
  config["activation_function"] = "relu";
  EXPECT_NE(refusal(config).find("'relu'"), std::string::npos);
  config = small_gpt2();
  config["activation_function"] = "gelu_fast";  // the tanh form under another name
  EXPECT_EQ(refusal(config), "");
  Json llama = small_llama();
  llama["hidden_act"] = "swish";  // SiLU's other name in transformers
  EXPECT_EQ(refusal(llama), "");
  llama["hidden_act"] = "gelu";
  EXPECT_NE(refusal(llama).find("'gelu'"), std::string::npos);
  config = small_gpt2();
  config["reorder_and_upcast_attn"] = true;  // inert: attention runs in f32 either way
  config["resid_pdrop"] = 0.1;
  EXPECT_EQ(refusal(config), "");
  config["hidden_size"] = 32;  // GPT2Config maps hidden_size onto n_embd
  EXPECT_NE(refusal(config).find("\"n_embd\" is 64 but \"hidden_size\" is 32"), std::string::npos)
      << refusal(config);
}

TEST(HfConfig, ModelTypeMustNameTheArchitecturesClass) {
  Json config = small_llama();
  config["model_type"] = "gpt2";
  EXPECT_NE(refusal(config).find("\"model_type\" is \"gpt2\""), std::string::npos)
      << refusal(config);
  config["model_type"] = "llama";
  EXPECT_EQ(refusal(config), "");
}

TEST(HfConfig, ExportedConfigsReadBack) {
  for (const char* text : {"gpt:layers=2,heads=2,dim=16,context=8,tie=1",
                           "llama:layers=2,heads=4,kv_heads=2,dim=16,ffn=32,context=8",
                           "llama:layers=1,heads=4,kv_heads=1,dim=16,ffn=48,context=8,qk_norm=1"}) {
    const nn::DecoderSpec config = nn::parse_decoder_spec(text);
    const Json json = config_json(config, tokenize::Tokenizer::bytes(), DType::f32);
    EXPECT_EQ(nn::decoder_architecture_text(parse_config_json(json, "config.json")),
              nn::decoder_architecture_text(config))
        << text;
  }
}

}  // namespace
}  // namespace meshtensor::hf
