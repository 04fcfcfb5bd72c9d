#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <unistd.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/core/file.hpp>
#include <meshtensor/core/half.hpp>
#include <meshtensor/core/untrusted_json.hpp>
#include <meshtensor/hf/hf_model.hpp>

#include "tensor_map.hpp"

namespace meshtensor::hf {

namespace fs = std::filesystem;
using Json = nlohmann::json;

namespace {

constexpr std::int64_t kMaxJsonFileBytes = std::int64_t{64} << 20;
constexpr double kGpt2LayerNormEps = 1e-5;  // nn::LayerNorm's epsilon

/// A JSON file of the folder, parsed; DataError naming it.
Json read_json(const fs::path& path, std::string_view what) {
  const std::string file = path.string();
  Json doc = parse_untrusted_json(read_regular_file(file, kMaxJsonFileBytes, what), file);
  if (doc.is_discarded() || !doc.is_object())
    throw DataError(fmt::format("{}: not a JSON object", file));
  return doc;
}

/// The ids Hugging Face's configs name as beginning and end of text: GPT-2's <|endoftext|> is
/// both, Llama 3's <|begin_of_text|> and <|end_of_text|>; null when the tokenizer has neither.
std::pair<Json, Json> bos_eos(const tokenize::Tokenizer& tokenizer) {
  const auto id = [&](std::string_view content) -> Json {
    for (const tokenize::AddedToken& token : tokenizer.added_tokens())
      if (token.content == content) return token.id;
    return nullptr;
  };
  Json bos = id("<|begin_of_text|>");
  Json eos = id("<|end_of_text|>");
  if (bos.is_null()) bos = id("<|endoftext|>");
  if (eos.is_null()) eos = id("<|endoftext|>");
  return {bos, eos};
}

std::string torch_dtype(DType dtype) {
  switch (dtype) {
    case DType::bf16:
      return "bfloat16";
    case DType::f16:
      return "float16";
    default:
      return "float32";
  }
}

/// A field of a config.json that must be there: an integer in [low, high] or a number.
class ConfigReader {
 public:
  ConfigReader(const Json& config, const std::string& file) : config_(config), file_(file) {}
  DataError bad(const std::string& key, const std::string& why) const {
    return DataError(fmt::format("{}: \"{}\" {}", file_, key, why));
  }
  bool has(const std::string& key) const {
    return config_.contains(key) && !config_[key].is_null();
  }
  std::int64_t integer(const std::string& key, std::int64_t low, std::int64_t high) const {
    if (!has(key)) throw bad(key, "is missing");
    const Json& value = config_[key];
    if (!value.is_number_integer() || value.get<std::int64_t>() < low ||
        value.get<std::int64_t>() > high) {
      throw bad(key,
                fmt::format("is {}, not an integer in [{}, {}]", json_excerpt(value), low, high));
    }
    return value.get<std::int64_t>();
  }
  double number(const std::string& key, double fallback) const {
    if (!has(key)) return fallback;
    if (!config_[key].is_number()) throw bad(key, fmt::format("is {}", json_excerpt(config_[key])));
    return config_[key].get<double>();
  }
  bool flag(const std::string& key, bool fallback) const {
    if (!has(key)) return fallback;
    if (!config_[key].is_boolean())
      throw bad(key, fmt::format("is {}", json_excerpt(config_[key])));
    return config_[key].get<bool>();
  }
  std::string text(const std::string& key, const std::string& fallback) const {
    if (!has(key)) return fallback;
    if (!config_[key].is_string()) throw bad(key, fmt::format("is {}", json_excerpt(config_[key])));
    return config_[key].get<std::string>();
  }
  /// Refuses a setting meshtensor does not compute.
  void require(const std::string& key, bool holds, const std::string& why) const {
    if (!holds) throw bad(key, why);
  }

 private:
  const Json& config_;
  const std::string& file_;
};

nn::DecoderConfig parse_gpt2(const ConfigReader& c, const std::string& file) {
  nn::GptConfig gpt;
  gpt.layers = c.integer("n_layer", 1, 256);
  gpt.heads = c.integer("n_head", 1, 256);
  gpt.dim = c.integer("n_embd", 1, 8192);
  gpt.context = c.integer("n_positions", 1, 8192);
  gpt.vocabulary = c.integer("vocab_size", 1, nn::kMaxVocabulary);
  gpt.tie = true;
  const std::string activation = c.text("activation_function", "gelu_new");
  c.require("activation_function", activation == "gelu_new" || activation == "gelu_pytorch_tanh",
            fmt::format("is '{}': the GPT computes GELU's tanh form (gelu_new)", activation));
  if (c.has("n_inner")) {
    c.require("n_inner", c.integer("n_inner", 1, 1 << 20) == 4 * gpt.dim,
              fmt::format("is not 4 x n_embd ({}): the GPT's MLP is 4 x dim wide", 4 * gpt.dim));
  }
  const double eps = c.number("layer_norm_epsilon", kGpt2LayerNormEps);
  c.require("layer_norm_epsilon", eps == kGpt2LayerNormEps,
            fmt::format("is {}: the GPT's LayerNorm epsilon is 1e-05", eps));
  c.require("tie_word_embeddings", c.flag("tie_word_embeddings", true),
            "is false: the GPT's head is GPT-2's, the token table");
  c.require("scale_attn_by_inverse_layer_idx", !c.flag("scale_attn_by_inverse_layer_idx", false),
            "is true: the GPT scales attention by 1/sqrt(head_dim) alone");
  c.require("add_cross_attention", !c.flag("add_cross_attention", false), "is true");
  try {
    const nn::GptConfig checked = nn::parse_gpt_config(nn::gpt_config_text(gpt));
    gpt.seed = checked.seed;
  } catch (const Error& e) {
    throw DataError(fmt::format("{}: {}", file, e.what()));
  }
  return gpt;
}

nn::DecoderConfig parse_llama(const ConfigReader& c, const std::string& file, bool qwen3) {
  const std::int64_t dim = c.integer("hidden_size", 1, 8192);
  const std::int64_t heads = c.integer("num_attention_heads", 1, 256);
  const std::int64_t kv_heads =
      c.has("num_key_value_heads") ? c.integer("num_key_value_heads", 1, 256) : heads;
  if (c.has("head_dim")) {
    c.require("head_dim", c.integer("head_dim", 1, 8192) * heads == dim,
              fmt::format("is not hidden_size / num_attention_heads ({})", dim / heads));
  }
  c.require("rope_scaling", !c.has("rope_scaling"),
            "is set: rotary embeddings are computed without scaling");
  c.require("hidden_act", c.text("hidden_act", "silu") == "silu", "is not silu");
  c.require("attention_bias", !c.flag("attention_bias", false), "is true: the Llama has no biases");
  c.require("mlp_bias", !c.flag("mlp_bias", false), "is true: the Llama has no biases");
  const std::string text = fmt::format(
      "llama:layers={},heads={},kv_heads={},dim={},ffn={},context={},rope_theta={},norm_eps={},"
      "qk_norm={},tie={}",
      c.integer("num_hidden_layers", 1, 256), heads, kv_heads, dim,
      c.integer("intermediate_size", 1, 65536), c.integer("max_position_embeddings", 1, 8192),
      c.number("rope_theta", 10000.0), c.number("rms_norm_eps", 1e-6), qwen3 ? 1 : 0,
      c.flag("tie_word_embeddings", false) ? 1 : 0);
  nn::LlamaConfig llama;
  try {
    llama = nn::parse_llama_config(text);
  } catch (const Error& e) {
    throw DataError(fmt::format("{}: {}", file, e.what()));
  }
  llama.vocabulary = c.integer("vocab_size", 1, nn::kMaxVocabulary);
  return llama;
}

/// The safetensors files of a folder: the shards model.safetensors.index.json names (plain file
/// names of the folder), or model.safetensors.
std::map<std::string, std::string> weight_files(const fs::path& directory) {
  std::map<std::string, std::string> files;  // tensor -> file name ("" : every tensor of it)
  const fs::path index = directory / "model.safetensors.index.json";
  if (!fs::exists(index)) {
    files[""] = "model.safetensors";
    return files;
  }
  const Json doc = read_json(index, "a safetensors index");
  if (!doc.contains("weight_map") || !doc["weight_map"].is_object())
    throw DataError(fmt::format("{}: no \"weight_map\" object", index.string()));
  for (const auto& [tensor, file] : doc["weight_map"].items()) {
    const std::string name = file.is_string() ? file.get<std::string>() : std::string();
    if (name.empty() || name.find('/') != std::string::npos || name == "." || name == ".." ||
        name.size() < 12 || name.substr(name.size() - 12) != ".safetensors") {
      throw DataError(
          fmt::format("{}: tensor '{}' lies in {}, not a .safetensors file of the folder",
                      index.string(), tensor, json_excerpt(file)));
    }
    files[tensor] = name;
  }
  return files;
}

/// Values a row of `entry` holds (1 for a 1-D tensor).
std::int64_t row_width(const checkpoint::SafetensorsEntry& entry) {
  return entry.shape.rank() == 2 ? entry.shape[1] : 1;
}

/// Reads rows [first, end) of `stored` (elements of a 1-D tensor) as flat f32: only their bytes.
Tensor read_rows(const StoredTensor& stored, std::int64_t first, std::int64_t end) {
  std::ifstream in(stored.file, std::ios::binary);
  const auto& entry = stored.entry;
  const std::int64_t width = row_width(entry);
  const auto size = static_cast<std::int64_t>(dtype_size(entry.dtype));
  Tensor raw = Tensor::uninitialized(Shape{(end - first) * width}, entry.dtype);
  const std::int64_t begin = entry.begin + first * width * size;
  in.seekg(stored.data_start + begin);
  in.read(reinterpret_cast<char*>(raw.bytes().data()),
          static_cast<std::streamsize>((end - first) * width * size));
  if (!in) {
    throw DataError(fmt::format("{}: cannot read tensor '{}' (bytes {} to {})", stored.file,
                                entry.name, begin, begin + (end - first) * width * size));
  }
  if (entry.dtype == DType::f32) return raw;
  Tensor out(raw.shape(), DType::f32);
  auto to = out.values<float>();
  if (entry.dtype == DType::bf16) {
    const auto from = raw.values<BFloat16>();
    std::transform(from.begin(), from.end(), to.begin(), [](BFloat16 v) { return to_float(v); });
  } else {
    const auto from = raw.values<Float16>();
    std::transform(from.begin(), from.end(), to.begin(), [](Float16 v) { return to_float(v); });
  }
  return out;
}

/// `tensor` (f32) as `dtype`.
Tensor converted(const Tensor& tensor, DType dtype) {
  if (dtype == DType::f32) return tensor;
  Tensor out(tensor.shape(), dtype);
  const auto from = tensor.values<float>();
  if (dtype == DType::bf16) {
    auto to = out.values<BFloat16>();
    std::transform(from.begin(), from.end(), to.begin(), [](float v) { return to_bfloat16(v); });
  } else {
    auto to = out.values<Float16>();
    std::transform(from.begin(), from.end(), to.begin(), [](float v) { return to_float16(v); });
  }
  return out;
}

/// Writes `bytes` to `path` through a temporary beside it; DataError naming the path.
void write_file(const fs::path& path, const std::string& head, std::span<const Tensor> tensors) {
  const fs::path temporary = path.string() + ".partial";
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    out.write(head.data(), static_cast<std::streamsize>(head.size()));
    for (const Tensor& tensor : tensors) {
      const auto bytes = tensor.bytes();
      out.write(reinterpret_cast<const char*>(bytes.data()),
                static_cast<std::streamsize>(bytes.size()));
    }
    if (!out.flush()) throw DataError(fmt::format("{}: cannot write", temporary.string()));
  }
  std::error_code error;
  fs::rename(temporary, path, error);
  if (error) throw DataError(fmt::format("{}: cannot write: {}", path.string(), error.message()));
}

void write_text(const fs::path& path, const std::string& text) {
  write_file(path, text, {});
}

}  // namespace

std::optional<std::string> folder_of(const std::string& path) {
  if (path.rfind(kPathPrefix, 0) != 0) return std::nullopt;
  return path.substr(kPathPrefix.size());
}

std::string architecture_of(const nn::DecoderConfig& config) {
  if (const auto* gpt = std::get_if<nn::GptConfig>(&config)) {
    if (!gpt->tie) {
      throw InvalidArgument(fmt::format(
          "model {} has a head of its own with a bias; GPT2LMHeadModel's head is the token "
          "table without one: train the GPT with tie=1 to export it",
          nn::gpt_config_text(*gpt)));
    }
    return "GPT2LMHeadModel";
  }
  return std::get<nn::LlamaConfig>(config).qk_norm ? "Qwen3ForCausalLM" : "LlamaForCausalLM";
}

Json config_json(const nn::DecoderConfig& config, const tokenize::Tokenizer& tokenizer,
                 DType dtype) {
  const auto [bos, eos] = bos_eos(tokenizer);
  Json out = {{"architectures", {architecture_of(config)}},
              {"bos_token_id", bos},
              {"eos_token_id", eos},
              {"torch_dtype", torch_dtype(dtype)},
              {"vocab_size", nn::decoder_vocabulary(config)}};
  if (const auto* gpt = std::get_if<nn::GptConfig>(&config)) {
    out.update({{"model_type", "gpt2"},
                {"n_layer", gpt->layers},
                {"n_head", gpt->heads},
                {"n_embd", gpt->dim},
                {"n_positions", gpt->context},
                {"n_ctx", gpt->context},
                {"n_inner", nullptr},
                {"activation_function", "gelu_new"},
                {"layer_norm_epsilon", kGpt2LayerNormEps},
                {"resid_pdrop", 0.0},
                {"embd_pdrop", 0.0},
                {"attn_pdrop", 0.0},
                {"initializer_range", gpt->init_std},
                {"scale_attn_weights", true},
                {"tie_word_embeddings", true}});
    return out;
  }
  const auto& llama = std::get<nn::LlamaConfig>(config);
  out.update({{"model_type", llama.qk_norm ? "qwen3" : "llama"},
              {"hidden_size", llama.dim},
              {"intermediate_size", llama.ffn},
              {"num_hidden_layers", llama.layers},
              {"num_attention_heads", llama.heads},
              {"num_key_value_heads", llama.kv_heads},
              {"head_dim", llama.dim / llama.heads},
              {"max_position_embeddings", llama.context},
              {"rms_norm_eps", llama.norm_eps},
              {"rope_theta", llama.rope_theta},
              {"rope_scaling", nullptr},
              {"hidden_act", "silu"},
              {"attention_bias", false},
              {"mlp_bias", false},
              {"initializer_range", llama.init_std},
              {"tie_word_embeddings", llama.tie}});
  return out;
}

nn::DecoderConfig parse_config_json(const Json& config, const std::string& file) {
  const ConfigReader reader(config, file);
  std::string architecture;
  if (config.contains("architectures") && config["architectures"].is_array() &&
      config["architectures"].size() == 1 && config["architectures"][0].is_string()) {
    architecture = config["architectures"][0].get<std::string>();
  }
  if (architecture == "GPT2LMHeadModel") return parse_gpt2(reader, file);
  if (architecture == "LlamaForCausalLM") return parse_llama(reader, file, false);
  if (architecture == "Qwen3ForCausalLM") return parse_llama(reader, file, true);
  const std::string named = !architecture.empty() ? "'" + architecture + "'"
                            : config.contains("architectures")
                                ? json_excerpt(config["architectures"])
                                : "(none given)";
  throw DataError(fmt::format(
      "{}: architecture {} is not GPT2LMHeadModel, LlamaForCausalLM or Qwen3ForCausalLM", file,
      named));
}

Folder read_folder(const std::string& directory) {
  const fs::path root(directory);
  if (!fs::is_directory(root))
    throw DataError(
        fmt::format("{}: not a Hugging Face model folder (no such directory)", directory));
  Folder folder;
  folder.directory = directory;
  folder.config = parse_config_json(read_json(root / "config.json", "a model config"),
                                    (root / "config.json").string());
  folder.tokenizer = std::make_shared<const tokenize::Tokenizer>(
      tokenize::Tokenizer::load((root / "tokenizer.json").string()));
  if (folder.tokenizer->vocabulary() != nn::decoder_vocabulary(folder.config)) {
    throw DataError(fmt::format("{}: vocab_size {} is not the {} tokens of its tokenizer.json",
                                (root / "config.json").string(),
                                nn::decoder_vocabulary(folder.config),
                                folder.tokenizer->vocabulary()));
  }
  const std::map<std::string, std::string> files = weight_files(root);
  std::map<std::string, checkpoint::SafetensorsHeader> headers;
  const auto header_of = [&](const std::string& name) -> const checkpoint::SafetensorsHeader& {
    auto found = headers.find(name);
    if (found == headers.end())
      found =
          headers.emplace(name, checkpoint::read_safetensors_header((root / name).string())).first;
    return found->second;
  };
  for (const Link& link : links_of(folder.config)) {
    const auto in_index = files.find(link.hf);
    const std::string file = files.count("") != 0      ? files.at("")
                             : in_index == files.end() ? ""
                                                       : in_index->second;
    const checkpoint::SafetensorsEntry* entry =
        file.empty() ? nullptr : header_of(file).find(link.hf);
    if (entry == nullptr)
      throw DataError(fmt::format("{}: tensor '{}' is missing", directory, link.hf));
    const Shape expected = hf_shape(folder.config, link, parameter_shape(folder.config, link.ours));
    if (entry->shape != expected) {
      throw DataError(fmt::format("{}: tensor '{}' has shape [{}], the config needs [{}]",
                                  directory, link.hf, fmt::join(entry->shape.dims(), ", "),
                                  fmt::join(expected.dims(), ", ")));
    }
    if (entry->dtype != DType::f32 && entry->dtype != DType::bf16 && entry->dtype != DType::f16) {
      throw DataError(fmt::format("{}: tensor '{}' is {}, not F32, BF16 or F16", directory, link.hf,
                                  checkpoint::safetensors_dtype_name(entry->dtype)));
    }
    folder.tensors[link.hf] = {(root / file).string(), *entry, header_of(file).data_start};
  }
  return folder;
}

std::vector<Tensor> load(const Folder& folder, std::span<const checkpoint::LoadRequest> requests) {
  const std::vector<Link> links = links_of(folder.config);
  std::vector<Tensor> out;
  for (const checkpoint::LoadRequest& request : requests) {
    const std::string name = request.name.rfind("model.", 0) == 0 ? request.name.substr(6) : "";
    const bool known = request.dtype == DType::f32 && !name.empty() &&
                       std::any_of(links.begin(), links.end(),
                                   [&](const Link& link) { return link.ours == name; });
    if (!known || parameter_shape(folder.config, name) != request.global_shape) {
      throw DataError(fmt::format("{}: '{}' ({} {}) is not a parameter of its model",
                                  folder.directory, request.name, dtype_name(request.dtype),
                                  request.global_shape.to_string()));
    }
    const Block block{request.global_shape, request.offset, request.shape};
    Tensor values(request.shape, DType::f32);
    for (const Link& link : links) {
      if (link.ours != name) continue;
      // Only the rows of the Hugging Face tensor this block reads are read.
      const auto [first, end] = rows_read(folder.config, link, block);
      if (first == end) continue;
      const StoredTensor& stored = folder.tensors.at(link.hf);
      const Tensor rows = read_rows(stored, first, end);
      block_from_rows(folder.config, link, block, rows.values<float>(), first,
                      row_width(stored.entry), values);
    }
    out.push_back(std::move(values));
  }
  return out;
}

namespace {

/// The files of an export into `root`: the shards (with their index), config.json,
/// generation_config.json and tokenizer.json; their names go to `report`.
void write_files(const fs::path& root, const nn::DecoderConfig& config,
                 const tokenize::Tokenizer& tokenizer, const ExportOptions& options,
                 const std::map<std::string, Tensor>& tensors,
                 const std::vector<std::vector<std::string>>& shards, ExportReport& report) {
  Json weight_map = Json::object();
  for (std::size_t s = 0; s < shards.size(); ++s) {
    const std::string file =
        shards.size() == 1 ? "model.safetensors"
                           : fmt::format("model-{:05}-of-{:05}.safetensors", s + 1, shards.size());
    std::vector<checkpoint::SafetensorsEntry> entries;
    std::vector<Tensor> data;
    for (const std::string& name : shards[s]) {
      entries.push_back({name, options.dtype, tensors.at(name).shape(), 0, 0});
      data.push_back(tensors.at(name));
      weight_map[name] = file;
    }
    write_file(root / file, checkpoint::encode_safetensors_header(entries, {{"format", "pt"}}),
               data);
    report.files.push_back(file);
  }
  if (shards.size() > 1) {
    const Json index = {{"metadata", {{"total_size", report.bytes}}}, {"weight_map", weight_map}};
    write_text(root / "model.safetensors.index.json", index.dump(2) + "\n");
    report.files.push_back("model.safetensors.index.json");
  }
  const auto [bos, eos] = bos_eos(tokenizer);
  write_text(root / "config.json", config_json(config, tokenizer, options.dtype).dump(2) + "\n");
  write_text(root / "generation_config.json", Json{{"bos_token_id", bos},
                                                   {"eos_token_id", eos},
                                                   {"max_length", nn::decoder_context(config)}}
                                                      .dump(2) +
                                                  "\n");
  write_text(root / "tokenizer.json", tokenizer.to_json() + "\n");
  for (const char* file : {"config.json", "generation_config.json", "tokenizer.json"})
    report.files.emplace_back(file);
}

}  // namespace

ExportReport export_folder(const std::string& directory, const nn::DecoderConfig& config,
                           const tokenize::Tokenizer& tokenizer,
                           const std::map<std::string, Tensor>& parameters,
                           const ExportOptions& options) {
  architecture_of(config);
  if (fs::exists(directory) && (!fs::is_directory(directory) || !fs::is_empty(directory))) {
    throw InvalidArgument(fmt::format(
        "{} exists and is not an empty folder: export into a new one (an export replaces nothing)",
        directory));
  }
  if (options.dtype != DType::f32 && options.dtype != DType::bf16 && options.dtype != DType::f16)
    throw InvalidArgument(
        fmt::format("dtype {} is not f32, bf16 or f16", dtype_name(options.dtype)));
  std::map<std::string, Tensor> tensors;  // by Hugging Face name: the order of the files
  for (const Link& link : links_of(config)) {
    const auto found = parameters.find(link.ours);
    if (found == parameters.end())
      throw InvalidArgument(fmt::format("the model has no parameter '{}'", link.ours));
    tensors[link.hf] = converted(to_hf(config, link, found->second), options.dtype);
  }
  std::vector<std::vector<std::string>> shards(1);
  std::int64_t in_shard = 0;
  ExportReport report;
  for (const auto& [name, tensor] : tensors) {
    const auto bytes = static_cast<std::int64_t>(tensor.nbytes());
    if (in_shard > 0 && in_shard + bytes > options.shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(name);
    in_shard += bytes;
    report.bytes += bytes;
    ++report.tensors;
  }
  // Everything is written into a staging folder beside the target and renamed into place, so a
  // failed export leaves nothing behind and never touches a file it did not create.
  fs::path target = fs::path(directory).lexically_normal();
  if (!target.has_filename()) target = target.parent_path();  // "out/" is "out"
  const fs::path root =
      target.parent_path() / fmt::format(".{}.partial-{}", target.filename().string(), ::getpid());
  fs::remove_all(root);
  fs::create_directories(root);
  try {
    write_files(root, config, tokenizer, options, tensors, shards, report);
    if (fs::exists(target)) fs::remove(target);  // an empty folder (checked first)
    fs::rename(root, target);
  } catch (...) {
    std::error_code ignored;
    fs::remove_all(root, ignored);
    throw;
  }
  return report;
}

}  // namespace meshtensor::hf
