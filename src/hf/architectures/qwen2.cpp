// Qwen2ForCausalLM (Qwen2, Qwen2.5): biases on q, k and v (none on o nor the MLP), heads of
// hidden_size / num_attention_heads unless head_dim says otherwise, Qwen's sliding window.

#include "llama_family.hpp"

namespace meshtensor::hf {

namespace {

constexpr LlamaClass kQwen2Class{.config_class = "Qwen2Config",
                                 .vocabulary = 151936,
                                 .ffn = 22016,
                                 .context = 32768,
                                 .kv_heads = 32,
                                 .head_dim = 0,
                                 .qk_norm = false,
                                 .qkv_bias = true,
                                 .bias_keys = false,
                                 .mlp_bias_key = false,
                                 .window = SlidingWindow::qwen};

bool exports_as_qwen2(const nn::DecoderSpec& llama) {
  return !llama.qk_norm && llama.qkv_bias && !llama.out_bias && !llama.mlp_bias;
}

}  // namespace

const Architecture& qwen2_architecture() {
  static const LlamaFamilyArchitecture architecture{"Qwen2ForCausalLM", "qwen2", "Qwen2Model",
                                                    kQwen2Class, exports_as_qwen2};
  return architecture;
}

}  // namespace meshtensor::hf
