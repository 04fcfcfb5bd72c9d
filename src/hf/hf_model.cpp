#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <unistd.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/core/file.hpp>
#include <meshtensor/core/half.hpp>
#include <meshtensor/core/untrusted_json.hpp>
#include <meshtensor/hf/hf_model.hpp>

#include "config_json.hpp"
#include "tensor_map.hpp"
#include "tokenizer_config.hpp"

namespace meshtensor::hf {

namespace fs = std::filesystem;
using Json = nlohmann::json;

namespace {

constexpr std::int64_t kMaxJsonFileBytes = std::int64_t{64} << 20;

/// A JSON file of the folder, parsed; DataError naming it.
Json read_json(const fs::path& path, std::string_view what) {
  const std::string file = path.string();
  Json doc = parse_untrusted_json(read_regular_file(file, kMaxJsonFileBytes, what), file);
  if (doc.is_discarded() || !doc.is_object())
    throw DataError(fmt::format("{}: not a JSON object", file));
  return doc;
}

/// The safetensors files of a folder: the shards model.safetensors.index.json names (plain file
/// names of the folder), or model.safetensors.
std::map<std::string, std::string> weight_files(const fs::path& directory) {
  std::map<std::string, std::string> files;  // tensor -> file name ("" : every tensor of it)
  const fs::path index = directory / "model.safetensors.index.json";
  const fs::path single = directory / "model.safetensors";
  std::error_code error;
  const bool has_index = fs::exists(index, error);
  if (has_index && fs::exists(single, error)) {
    // Decided: two sets of weights in one folder are refused, not chosen between.
    throw DataError(fmt::format(
        "{}: holds both model.safetensors and model.safetensors.index.json: which weights are "
        "the model's is ambiguous (remove the one that is not)",
        directory.string()));
  }
  if (!has_index) {
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

using Entry = checkpoint::SafetensorsEntry;

/// A tensor's name in its base model's own files: "transformer.h.0.ln_1.weight" is
/// "h.0.ln_1.weight" in GPT2Model's, "model.norm.weight" is "norm.weight" in LlamaModel's.
std::string base_model_name(const std::string& name) {
  for (const std::string_view prefix : {"transformer.", "model."})
    if (name.rfind(prefix, 0) == 0) return name.substr(prefix.size());
  return name;
}

/// Values a row of `entry` holds (1 for a 1-D tensor).
std::int64_t row_width(const checkpoint::SafetensorsEntry& entry) {
  return entry.shape.rank() == 2 ? entry.shape[1] : 1;
}

/// Refuses a NaN or an infinity among `values` (elements from `first` on of `stored`): such a
/// weight would make every logit NaN.
void check_finite(std::span<const float> v, const StoredTensor& stored, std::int64_t first) {
  const auto bad = std::find_if(v.begin(), v.end(), [](float x) { return !std::isfinite(x); });
  if (bad == v.end()) return;
  throw DataError(
      fmt::format("{}: tensor '{}' holds {} at element {}: a model's weights must "
                  "be finite",
                  stored.file, stored.entry.name, *bad, first + (bad - v.begin())));
}

/// Buffers a load reuses from tensor to tensor, so that reading a model touches fresh memory
/// only for its parameters.
struct ReadBuffers {
  std::vector<char> raw;
  std::vector<float> values;
};

/// Reads rows [first, end) of `stored` (elements of a 1-D tensor) into buffers.values as flat
/// f32: only their bytes.
void read_rows(const StoredTensor& stored, std::int64_t first, std::int64_t end,
               ReadBuffers& buffers) {
  std::ifstream in(stored.file, std::ios::binary);
  const auto& entry = stored.entry;
  const std::int64_t width = row_width(entry);
  const auto size = static_cast<std::int64_t>(dtype_size(entry.dtype));
  const auto count = static_cast<std::size_t>((end - first) * width);
  buffers.raw.resize(count * static_cast<std::size_t>(size));
  const std::int64_t begin = entry.begin + first * width * size;
  in.seekg(stored.data_start + begin);
  in.read(buffers.raw.data(), static_cast<std::streamsize>(buffers.raw.size()));
  if (!in) {
    throw DataError(fmt::format("{}: cannot read tensor '{}' (bytes {} to {})", stored.file,
                                entry.name, begin, begin + (end - first) * width * size));
  }
  buffers.values.resize(count);
  float* to = buffers.values.data();
  const char* from = buffers.raw.data();
  if (entry.dtype == DType::f32) {
    std::memcpy(to, from, count * sizeof(float));
  } else if (entry.dtype == DType::bf16) {
    for (std::size_t i = 0; i < count; ++i) {
      std::uint16_t bits = 0;
      std::memcpy(&bits, from + 2 * i, 2);
      const std::uint32_t wide = static_cast<std::uint32_t>(bits) << 16;
      std::memcpy(to + i, &wide, 4);
    }
  } else if (entry.dtype == DType::f64) {  // rounded to nearest; past f32's range is infinite
    for (std::size_t i = 0; i < count; ++i) {
      double v = 0;
      std::memcpy(&v, from + 8 * i, 8);
      to[i] = static_cast<float>(v);
    }
  } else {
    for (std::size_t i = 0; i < count; ++i) {
      Float16 v;
      std::memcpy(&v, from + 2 * i, 2);
      to[i] = to_float(v);
    }
  }
  check_finite(buffers.values, stored, first * width);
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

namespace {

/// The tokenizer of a folder: its SentencePiece tokenizer.model where it has one meshtensor
/// reads (the model itself, encoded by the sentencepiece library), otherwise its tokenizer.json.
tokenize::Tokenizer folder_tokenizer(const fs::path& root) {
  const fs::path model = root / "tokenizer.model";
  std::error_code error;
  if (fs::is_regular_file(model, error)) {
    try {
      return tokenize::Tokenizer::load(model.string());
    } catch (const DataError&) {
      if (!fs::exists(root / "tokenizer.json", error)) throw;
    }
  }
  return tokenize::Tokenizer::load((root / "tokenizer.json").string());
}

/// The folder's tokenizer with its tokenizer_config.json and generation_config.json applied.
tokenize::Tokenizer configured_tokenizer(const fs::path& root, const Json& model_config) {
  tokenize::Tokenizer tokenizer = folder_tokenizer(root);
  const auto optional_json = [&](const char* name, std::string_view what) {
    std::error_code error;
    return fs::exists(root / name, error) ? read_json(root / name, what) : Json();
  };
  std::optional<std::string> template_file;  // transformers' newer place for the template
  std::error_code error;
  if (fs::exists(root / "chat_template.jinja", error)) {
    template_file = read_regular_file((root / "chat_template.jinja").string(), kMaxJsonFileBytes,
                                      "a chat template");
  }
  apply_tokenizer_configs(tokenizer, optional_json("tokenizer_config.json", "a tokenizer config"),
                          (root / "tokenizer_config.json").string(),
                          optional_json("generation_config.json", "a generation config"),
                          (root / "generation_config.json").string(), model_config,
                          (root / "config.json").string(),
                          template_file ? &*template_file : nullptr);
  return tokenizer;
}

}  // namespace

Folder read_folder(const std::string& directory) {
  const fs::path root(directory);
  std::error_code error;
  const fs::file_status status = fs::status(root, error);
  if (!fs::is_directory(status)) {
    throw DataError(fmt::format("{}: not a Hugging Face model folder ({})", directory,
                                error                ? error.message()
                                : fs::exists(status) ? "not a directory"
                                                     : "no such directory"));
  }
  Folder folder;
  folder.directory = directory;
  const Json model_config = read_json(root / "config.json", "a model config");
  folder.config = parse_config_json(model_config, (root / "config.json").string());
  tokenize::Tokenizer tokenizer = configured_tokenizer(root, model_config);
  if (tokenizer.vocabulary() > folder.config.vocabulary) {
    throw DataError(fmt::format(
        "{}: vocab_size {} is fewer than the {} tokens of its "
        "tokenizer.json",
        (root / "config.json").string(), folder.config.vocabulary, tokenizer.vocabulary()));
  }
  // An embedding padded past the tokenizer (Qwen's): the ids past its tokens decode to nothing.
  tokenizer.pad_vocabulary(folder.config.vocabulary, (root / "config.json").string());
  folder.tokenizer = std::make_shared<const tokenize::Tokenizer>(std::move(tokenizer));
  const std::map<std::string, std::string> files = weight_files(root);
  std::map<std::string, checkpoint::SafetensorsHeader> headers;
  const auto header_of = [&](const std::string& name) -> const checkpoint::SafetensorsHeader& {
    auto found = headers.find(name);
    if (found == headers.end())
      found =
          headers.emplace(name, checkpoint::read_safetensors_header((root / name).string())).first;
    return found->second;
  };
  // A tensor is found under its name or, as a base model (GPT2Model, LlamaModel) saves it,
  // without the prefix of the model inside the head ("transformer.", "model.").
  const auto find = [&](const std::string& name) -> std::pair<std::string, const Entry*> {
    const auto in_index = files.find(name);
    const std::string file = files.count("") != 0      ? files.at("")
                             : in_index == files.end() ? ""
                                                       : in_index->second;
    return {file, file.empty() ? nullptr : header_of(file).find(name)};
  };
  for (const Link& link : links_of(folder.config)) {
    auto [file, entry] = find(link.hf);
    const std::string bare = base_model_name(link.hf);
    if (bare != link.hf) {
      const auto [bare_file, bare_entry] = find(bare);
      if (entry != nullptr && bare_entry != nullptr) {
        throw DataError(
            fmt::format("{}: holds both '{}' and '{}': which is the model's is "
                        "ambiguous",
                        directory, link.hf, bare));
      }
      if (entry == nullptr) {
        file = bare_file;
        entry = bare_entry;
      }
    }
    if (entry == nullptr) {
      throw DataError(fmt::format(
          "{}: tensor '{}' is missing{}", directory, link.hf,
          bare != link.hf ? fmt::format(" (and so is its base model's name '{}')", bare) : ""));
    }
    const Shape expected = hf_shape(folder.config, link, parameter_shape(folder.config, link.ours));
    if (entry->shape != expected) {
      throw DataError(fmt::format("{}: tensor '{}' has shape [{}], the config needs [{}]",
                                  directory, link.hf, fmt::join(entry->shape.dims(), ", "),
                                  fmt::join(expected.dims(), ", ")));
    }
    if (entry->dtype != DType::f32 && entry->dtype != DType::bf16 && entry->dtype != DType::f16 &&
        entry->dtype != DType::f64) {
      throw DataError(fmt::format("{}: tensor '{}' is {}, not F32, BF16, F16 or F64", directory,
                                  link.hf, checkpoint::safetensors_dtype_name(entry->dtype)));
    }
    folder.tensors[link.hf] = {(root / file).string(), *entry, header_of(file).data_start};
  }
  return folder;
}

void load_into(const Folder& folder, std::span<const checkpoint::LoadRequest> requests,
               std::span<Tensor> targets) {
  const std::vector<Link> links = links_of(folder.config);
  ReadBuffers buffers;
  for (std::size_t r = 0; r < requests.size(); ++r) {
    const checkpoint::LoadRequest& request = requests[r];
    const std::string name = request.name.rfind("model.", 0) == 0 ? request.name.substr(6) : "";
    const bool known = request.dtype == DType::f32 && !name.empty() &&
                       std::any_of(links.begin(), links.end(),
                                   [&](const Link& link) { return link.ours == name; });
    if (!known || parameter_shape(folder.config, name) != request.global_shape) {
      throw DataError(fmt::format("{}: '{}' ({} {}) is not a parameter of its model",
                                  folder.directory, request.name, dtype_name(request.dtype),
                                  request.global_shape.to_string()));
    }
    Tensor& values = targets[r];
    if (values.dtype() != DType::f32 || values.shape() != request.shape || !values.is_contiguous())
      throw InvalidArgument(fmt::format("{}: the target of '{}' is not a contiguous f32 {}",
                                        folder.directory, request.name, request.shape.to_string()));
    const Block block{request.global_shape, request.offset, request.shape};
    for (const Link& link : links) {
      if (link.ours != name) continue;
      // Only the rows of the Hugging Face tensor this block reads are read.
      const auto [first, end] = rows_read(folder.config, link, block);
      if (first == end) continue;
      const StoredTensor& stored = folder.tensors.at(link.hf);
      read_rows(stored, first, end, buffers);
      block_from_rows(folder.config, link, block, buffers.values, first, row_width(stored.entry),
                      values);
    }
  }
}

std::vector<Tensor> load(const Folder& folder, std::span<const checkpoint::LoadRequest> requests) {
  std::vector<Tensor> out;
  for (const checkpoint::LoadRequest& request : requests)
    out.emplace_back(request.shape, DType::f32);
  load_into(folder, requests, out);
  return out;
}

namespace {

/// The folder an export into `directory` fills: the folder itself, or the folder a symbolic
/// link names (the link stays). It must not exist or be an empty folder.
fs::path export_target(const std::string& directory) {
  fs::path target = fs::path(directory).lexically_normal();
  if (!target.has_filename()) target = target.parent_path();  // "out/" is "out"
  if (target.empty()) target = ".";
  std::error_code error;
  if (fs::is_symlink(fs::symlink_status(target, error))) {
    const fs::path resolved = fs::canonical(target, error);
    if (error) {
      throw DataError(
          fmt::format("{} is a symbolic link that leads to no folder ({}): export "
                      "into a folder",
                      directory, error.message()));
    }
    target = resolved;
  }
  const fs::file_status status = fs::status(target, error);
  if (error && error != std::errc::no_such_file_or_directory)
    throw DataError(fmt::format("{}: {}", directory, error.message()));
  error.clear();
  if (fs::exists(status) && (!fs::is_directory(status) || !fs::is_empty(target, error))) {
    throw InvalidArgument(fmt::format(
        "{} exists and is not an empty folder: export into a new one (an export replaces nothing)",
        directory));
  }
  if (error) throw DataError(fmt::format("{}: {}", directory, error.message()));
  return target;
}

/// The files of an export into `root`: the shards (with their index), config.json,
/// generation_config.json and tokenizer.json; their names go to `report`.
void write_files(const fs::path& root, const nn::DecoderSpec& config,
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
  const std::int64_t context = config.context;
  write_text(root / "config.json", config_json(config, tokenizer, options.dtype).dump(2) + "\n");
  write_text(root / "generation_config.json",
             generation_config_json(tokenizer, context).dump(2) + "\n");
  write_text(root / "tokenizer_config.json",
             tokenizer_config_json(tokenizer, context).dump(2) + "\n");
  for (const char* file :
       {"config.json", "generation_config.json", "tokenizer_config.json", "tokenizer.json"})
    report.files.emplace_back(file);
  if (const auto& model = tokenizer.sentencepiece()) {
    write_text(root / "tokenizer.model", model->serialized());
    report.files.emplace_back("tokenizer.model");
  }
  write_text(root / "tokenizer.json", tokenizer.to_hugging_face_json() + "\n");
}

}  // namespace

std::int64_t parse_shard_size(std::string_view name, const std::string& text) {
  const std::map<std::string, std::int64_t> units{{"", 1},
                                                  {"B", 1},
                                                  {"KB", 1000},
                                                  {"MB", 1000 * 1000},
                                                  {"GB", 1000000000},
                                                  {"KiB", 1 << 10},
                                                  {"MiB", 1 << 20},
                                                  {"GiB", std::int64_t{1} << 30}};
  std::size_t digits = 0;
  while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits])) != 0)
    ++digits;
  const auto unit = units.find(text.substr(digits));
  if (digits == 0 || unit == units.end()) {
    throw ParseError(
        fmt::format("{} '{}' is not a size such as 2GB, 500MB, 64MiB or 4096", name, text));
  }
  // Digit by digit, refusing before anything wraps.
  constexpr std::int64_t kLargest = std::numeric_limits<std::int64_t>::max();
  std::int64_t count = 0;
  for (std::size_t i = 0; i < digits; ++i) {
    const int digit = text[i] - '0';
    if (count > (kLargest - digit) / 10 || count * 10 + digit > kLargest / unit->second)
      throw ParseError(
          fmt::format("{} '{}' is past the largest size ({} bytes)", name, text, kLargest));
    count = count * 10 + digit;
  }
  if (count < 1) throw ParseError(fmt::format("{} '{}' is not positive", name, text));
  return count * unit->second;
}

ExportReport export_folder(const std::string& directory, const nn::DecoderSpec& config,
                           const tokenize::Tokenizer& tokenizer,
                           const std::map<std::string, Tensor>& parameters,
                           const ExportOptions& options) {
  architecture_of(config);
  const fs::path target = export_target(directory);
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
  report.architecture = architecture_of(config);
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
  const fs::path root =
      target.parent_path() / fmt::format(".{}.partial-{}", target.filename().string(), ::getpid());
  try {
    fs::remove_all(root);
    fs::create_directories(root);
    write_files(root, config, tokenizer, options, tensors, shards, report);
    if (fs::exists(target)) fs::remove(target);  // an empty folder (checked first)
    fs::rename(root, target);
  } catch (const fs::filesystem_error& e) {
    std::error_code ignored;
    fs::remove_all(root, ignored);
    throw DataError(fmt::format("{}: cannot write the export: {}", directory, e.code().message()));
  } catch (...) {
    std::error_code ignored;
    fs::remove_all(root, ignored);
    throw;
  }
  return report;
}

}  // namespace meshtensor::hf
