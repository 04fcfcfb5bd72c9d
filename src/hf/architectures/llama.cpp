// LlamaForCausalLM (Llama 2, 3, 3.1, 3.2; SmolLM; TinyLlama): attention_bias and mlp_bias where
// the config sets them, heads of head_dim, RoPE rescaled as rope_scaling says, no window.

#include "llama_family.hpp"

namespace meshtensor::hf {

namespace {

constexpr LlamaClass kLlamaClass{.config_class = "LlamaConfig",
                                 .vocabulary = 32000,
                                 .ffn = 11008,
                                 .context = 2048,
                                 .kv_heads = 0,
                                 .head_dim = 0,
                                 .qk_norm = false,
                                 .qkv_bias = false,
                                 .bias_keys = true,
                                 .mlp_bias_key = true,
                                 .window = SlidingWindow::none};

bool exports_as_llama(const nn::DecoderSpec& llama) {
  // attention_bias puts biases on q, k, v and o together.
  return !llama.qk_norm && llama.qkv_bias == llama.out_bias;
}

}  // namespace

const Architecture& llama_architecture() {
  static const LlamaFamilyArchitecture architecture{"LlamaForCausalLM", "llama", "LlamaModel",
                                                    kLlamaClass, exports_as_llama};
  return architecture;
}

}  // namespace meshtensor::hf
