#pragma once

// How meshtensor's parameters become Hugging Face tensors and back: names, transposes, and the
// columns of the fused projections.

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <meshtensor/core/tensor.hpp>
#include <meshtensor/nn/models.hpp>

namespace meshtensor::hf {

/// How a meshtensor parameter's columns (its last dim) map to a Hugging Face tensor's.
enum class Columns {
  identity,   ///< column c is column (or row) c
  gpt_qkv,    ///< head-major [q_h k_h v_h] -> GPT-2's c_attn [all q | all k | all v]
  llama_qkv,  ///< group-major [q.. of the group, k, v] -> q_proj (part 0), k_proj (1), v_proj (2)
  gate_up,    ///< blocks of [gate | up] -> gate_proj (part 0), up_proj (part 1)
};

/// One Hugging Face tensor: the parameter it comes from and how.
struct Link {
  std::string hf;    ///< Hugging Face name
  std::string ours;  ///< meshtensor parameter name (without "model.")
  Columns columns = Columns::identity;
  int part = 0;  ///< which Hugging Face tensor of a split parameter
  /// Hugging Face keeps [out, in] (torch.nn.Linear) where meshtensor keeps [in, out].
  bool transposed = false;
};

/// Every Hugging Face tensor of the decoder `config` (architecture_of() must accept it), in
/// the order of the model.
std::vector<Link> links_of(const nn::DecoderSpec& config);

/// The shape of meshtensor's parameter `ours` (a Link's) in the decoder `config`.
Shape parameter_shape(const nn::DecoderSpec& config, const std::string& ours);

/// The Hugging Face tensor of `link` from the whole parameter `ours` (f32).
Tensor to_hf(const nn::DecoderSpec& config, const Link& link, const Tensor& ours);

/// The shape the Hugging Face tensor of `link` has for a parameter of shape `ours`.
Shape hf_shape(const nn::DecoderSpec& config, const Link& link, const Shape& ours);

/// A block of a parameter of shape `ours`: its first element and its extent (empty offset: the
/// origin).
struct Block {
  Shape ours;
  std::vector<std::int64_t> offset;
  Shape extent;
};

/// The rows [first, end) of the Hugging Face tensor of `link` that `block` reads (elements of a
/// 1-D tensor); first == end when it reads none.
std::pair<std::int64_t, std::int64_t> rows_read(const nn::DecoderSpec& config, const Link& link,
                                                const Block& block);

/// Writes into `out` (f32, the block's extent) the elements of `block` that `link` holds, from
/// `rows`: rows [first, ...) of the Hugging Face tensor, flat f32 of `width` values a row.
void block_from_rows(const nn::DecoderSpec& config, const Link& link, const Block& block,
                     std::span<const float> rows, std::int64_t first, std::int64_t width,
                     Tensor& out);

}  // namespace meshtensor::hf
