#pragma once

// Hugging Face model folders: config.json, model.safetensors (or shards with
// model.safetensors.index.json), tokenizer.json and its configs, for the classes of the
// registry (src/hf/architecture.hpp): GPT2LMHeadModel, LlamaForCausalLM, Qwen2ForCausalLM and
// Qwen3ForCausalLM.

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include <meshtensor/checkpoint/checkpoint.hpp>
#include <meshtensor/checkpoint/safetensors.hpp>
#include <meshtensor/core/tensor.hpp>
#include <meshtensor/nn/models.hpp>
#include <meshtensor/tokenize/tokenizer.hpp>

namespace meshtensor::hf {

/// The prefix of a path that names a Hugging Face folder: "hf:DIR".
inline constexpr std::string_view kPathPrefix = "hf:";

/// The folder of an "hf:DIR" path, or nullopt for any other path.
std::optional<std::string> folder_of(const std::string& path);

/// The Hugging Face class a decoder exports as: "GPT2LMHeadModel", "Qwen3ForCausalLM" (QK-norm),
/// "Qwen2ForCausalLM" (biases on q, k and v alone) or "LlamaForCausalLM". InvalidArgument with
/// the reason for a model that has no such class: a GPT with its own head (GPT2LMHeadModel's
/// head is the token table, without bias), biases no class lays out.
std::string architecture_of(const nn::DecoderSpec& config);

/// The config.json of a decoder reading `tokenizer`'s tokens, its weights stored as `dtype`.
nlohmann::json config_json(const nn::DecoderSpec& config, const tokenize::Tokenizer& tokenizer,
                           DType dtype);

/// The decoder a config.json describes (`file` names it in errors): DataError naming the field
/// for an unknown architecture, a missing or out-of-range field, or a setting meshtensor does
/// not compute (another activation or norm epsilon, a RoPE type other than default, linear and
/// llama3, a sliding window shorter than the context, ...).
nn::DecoderSpec parse_config_json(const nlohmann::json& config, const std::string& file);

/// One tensor of a folder: its file and where its bytes lie.
struct StoredTensor {
  std::string file;  ///< path of the safetensors file
  checkpoint::SafetensorsEntry entry;
  std::int64_t data_start = 0;  ///< where the file's data section starts
};

/// A Hugging Face folder, read and checked: its decoder, its tokenizer, and every tensor the
/// decoder needs, present with the shape it needs in bf16, f16 or f32. Tensors the decoder
/// does not use are ignored.
struct Folder {
  std::string directory;
  nn::DecoderSpec config;
  std::shared_ptr<const tokenize::Tokenizer> tokenizer;
  std::map<std::string, StoredTensor> tensors;  ///< by Hugging Face name
};

/// Reads the folder `directory`: config.json, tokenizer.json, model.safetensors.index.json and
/// its shards or model.safetensors. DataError naming the file and the problem: a missing file,
/// an unknown architecture, a missing tensor, a wrong shape or dtype, a shard the index names
/// outside the folder, a safetensors header that does not describe its file, a vocab_size below
/// the tokenizer's tokens (one above pads the tokenizer: Tokenizer::pad_vocabulary).
Folder read_folder(const std::string& directory);

/// The blocks `requests` name ("model.<parameter>" of the folder's decoder, as a checkpoint of
/// meshtensor holds them), as f32: of each Hugging Face tensor a block comes from, only the span
/// of rows the block touches is read and converted. DataError naming a request that is not a
/// parameter of the decoder or has another shape.
std::vector<Tensor> load(const Folder& folder, std::span<const checkpoint::LoadRequest> requests);

/// load(), each block written into the matching tensor of `targets` (contiguous f32 of the
/// block's shape, e.g. a parameter's value): nothing is allocated per block.
void load_into(const Folder& folder, std::span<const checkpoint::LoadRequest> requests,
               std::span<Tensor> targets);

/// How export_folder writes.
struct ExportOptions {
  DType dtype = DType::f32;                          ///< f32, bf16 or f16
  std::int64_t shard_bytes = std::int64_t{2} << 30;  ///< most tensor bytes in one file
};

/// A shard size: "2GB", "500MB", "4096" (bytes), decimal units as Hugging Face's
/// max_shard_size, or binary ones (KiB, MiB, GiB); at least 1 byte and at most 2^63 - 1.
/// ParseError starting with `name` and quoting the text.
std::int64_t parse_shard_size(std::string_view name, const std::string& text);

/// What export_folder wrote.
struct ExportReport {
  std::string architecture;        ///< the Hugging Face class written
  std::vector<std::string> files;  ///< in the folder, in the order written
  std::int64_t tensors = 0;
  std::int64_t bytes = 0;  ///< tensor bytes
};

/// Writes the decoder `config` with the parameters `parameters` (whole, f32, by meshtensor's
/// names) and its tokenizer as a Hugging Face folder `directory`, which must not exist or be an
/// empty folder (InvalidArgument naming it otherwise). Written into a staging folder beside it
/// and renamed into place: a failed export leaves nothing.
/// config.json, generation_config.json, tokenizer.json and one model.safetensors, or shards
/// model-0000k-of-0000n.safetensors of at most `shard_bytes` with model.safetensors.index.json.
/// Tensors are written by Hugging Face name in name order, so the same model gives the same
/// bytes. InvalidArgument for a model the format cannot express (architecture_of) or a dtype
/// that is not a float of at most 32 bits.
ExportReport export_folder(const std::string& directory, const nn::DecoderSpec& config,
                           const tokenize::Tokenizer& tokenizer,
                           const std::map<std::string, Tensor>& parameters,
                           const ExportOptions& options);

}  // namespace meshtensor::hf
