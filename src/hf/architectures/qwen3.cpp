// Qwen3ForCausalLM: an RMSNorm of each head's queries and keys, heads of head_dim (128 by
// default, whatever hidden_size is), attention_bias on q, k, v and o, Qwen's sliding window.

#include "llama_family.hpp"

namespace meshtensor::hf {

namespace {

constexpr LlamaClass kQwen3Class{.config_class = "Qwen3Config",
                                 .vocabulary = 151936,
                                 .ffn = 22016,
                                 .context = 32768,
                                 .kv_heads = 32,
                                 .head_dim = 128,
                                 .qk_norm = true,
                                 .qkv_bias = false,
                                 .bias_keys = true,
                                 .mlp_bias_key = false,
                                 .window = SlidingWindow::qwen};

bool exports_as_qwen3(const nn::DecoderSpec& llama) {
  return llama.qk_norm && llama.qkv_bias == llama.out_bias && !llama.mlp_bias;
}

}  // namespace

const Architecture& qwen3_architecture() {
  static const LlamaFamilyArchitecture architecture{"Qwen3ForCausalLM", "qwen3", "Qwen3Model",
                                                    kQwen3Class, exports_as_qwen3};
  return architecture;
}

}  // namespace meshtensor::hf
