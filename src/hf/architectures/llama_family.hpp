#pragma once

// What the Llama family's classes (LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM) share:
// one reader of their configs, one writer and one table of tensors, each class giving its
// defaults and its fixed settings.

#include <cstdint>
#include <vector>

#include <nlohmann/json.hpp>

#include <meshtensor/nn/llama.hpp>

#include "../architecture.hpp"
#include "../config_reader.hpp"
#include "../tensor_map.hpp"

namespace meshtensor::hf {

/// How a class lays out sliding-window attention in its config.
enum class SlidingWindow {
  none,  ///< the class has none: use_sliding_window must be false
  qwen,  ///< use_sliding_window, then layer_types or the layers from max_window_layers on
};

/// What distinguishes a class of the Llama family: its defaults and what it fixes.
struct LlamaClass {
  const char* config_class;  ///< for messages: "Qwen2Config"
  std::int64_t vocabulary;
  std::int64_t ffn;
  std::int64_t context;
  std::int64_t kv_heads;  ///< 0: num_attention_heads
  std::int64_t head_dim;  ///< 0: hidden_size / num_attention_heads
  bool qk_norm;           ///< Qwen3's norms of queries and keys
  bool qkv_bias;          ///< biases on q, k and v whatever the config says (Qwen2)
  bool bias_keys;         ///< the config has attention_bias (and mlp_bias where `mlp_bias_key`)
  bool mlp_bias_key;
  SlidingWindow window;
};

/// A class of the Llama family: its config read and written by its LlamaClass, the family's
/// tensors (model.layers.N.self_attn.q_proj.weight, ...).
class LlamaFamilyArchitecture : public Architecture {
 public:
  /// `exports` says which Llama configs the class expresses.
  LlamaFamilyArchitecture(const char* head_class, const char* type, const char* base,
                          const LlamaClass& cls, bool (*expresses)(const nn::DecoderSpec&))
      : Architecture(head_class, type, base), class_(cls), exports_(expresses) {}
  nn::DecoderSpec parse(ConfigReader& c) const override;
  bool exports(const nn::DecoderSpec& config) const override;
  void write(const nn::DecoderSpec& config, nlohmann::json& out) const override;
  void links(const nn::DecoderSpec& config, std::vector<Link>& out) const override;

 private:
  LlamaClass class_;
  bool (*exports_)(const nn::DecoderSpec&);
};

}  // namespace meshtensor::hf
