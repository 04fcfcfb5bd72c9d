#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <meshtensor/nn/decoder_spec.hpp>

namespace meshtensor::nn {

/// True for the model texts parse_llama_config reads ("llama", "llama:...").
bool is_llama_model(const std::string& text);

/// Parses "llama" or "llama:layers=L,heads=H,kv_heads=K,dim=D,ffn=F,context=T,rope_theta=R,
/// norm_eps=E,qk_norm=0|1,tie=0|1[,head_dim=N][,qkv_bias=1][,out_bias=1][,mlp_bias=1]
/// [,rope_scaling=linear:F|llama3:F:LOW:HIGH:ORIGINAL]" (any subset of the keys, in any order).
/// ParseError naming the bad part: an unknown or repeated key, a value out of range, K not
/// dividing H, dim not a multiple of H (without head_dim), an odd head dim, a scaling that does
/// not parse.
DecoderSpec parse_llama_config(const std::string& text);

/// The text parse_llama_config reads back: every key of the first line above, then the others
/// where they are not their defaults.
std::string llama_config_text(const DecoderSpec& config);

}  // namespace meshtensor::nn
