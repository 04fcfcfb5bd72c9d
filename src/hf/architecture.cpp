#include "architecture.hpp"

#include <array>

#include <fmt/format.h>

#include <meshtensor/core/error.hpp>

namespace meshtensor::hf {

// Each class's file.
const Architecture& gpt2_architecture();
const Architecture& llama_architecture();
const Architecture& qwen2_architecture();
const Architecture& qwen3_architecture();

std::span<const Architecture* const> architectures() {
  static const std::array<const Architecture*, 4> all = {
      &gpt2_architecture(), &qwen3_architecture(), &qwen2_architecture(), &llama_architecture()};
  return all;
}

const Architecture* find_architecture(const std::string& name) {
  for (const Architecture* a : architectures())
    if (name == a->name || name == a->base_model) return a;
  return nullptr;
}

const Architecture& export_architecture(const nn::DecoderSpec& config) {
  for (const Architecture* a : architectures())
    if (a->exports(config)) return *a;
  if (config.family == nn::DecoderFamily::gpt) {
    throw InvalidArgument(fmt::format(
        "model {} has a head of its own with a bias; GPT2LMHeadModel's head is the token "
        "table without one: train the GPT with tie=1 to export it",
        nn::decoder_spec_text(config)));
  }
  throw InvalidArgument(fmt::format(
      "model {} has biases no Hugging Face class lays out so (LlamaForCausalLM's attention_bias "
      "puts them on q, k, v and o together, Qwen2ForCausalLM's on q, k and v alone)",
      nn::decoder_spec_text(config)));
}

}  // namespace meshtensor::hf
