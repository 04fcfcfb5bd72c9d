#include <algorithm>
#include <bit>
#include <cstring>
#include <numeric>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <meshtensor/checkpoint/safetensors.hpp>
#include <meshtensor/core/error.hpp>
#include <meshtensor/core/untrusted_json.hpp>

#include "file_io.hpp"

namespace meshtensor::checkpoint {

namespace {

struct DTypeName {
  DType dtype;
  const char* name;
};
constexpr DTypeName kNames[] = {{DType::f64, "F64"}, {DType::f32, "F32"}, {DType::bf16, "BF16"},
                                {DType::f16, "F16"}, {DType::i64, "I64"}, {DType::i32, "I32"},
                                {DType::u8, "U8"}};

constexpr char kMetadataKey[] = "__metadata__";

std::uint64_t load_le64(const std::byte* bytes) {
  std::uint64_t value = 0;
  for (int i = 7; i >= 0; --i)
    value = (value << 8) | static_cast<std::uint64_t>(bytes[i]);
  return value;
}

}  // namespace

std::string safetensors_dtype_name(DType dtype) {
  for (const auto& entry : kNames)
    if (entry.dtype == dtype) return entry.name;
  throw InvalidArgument(fmt::format("dtype {} has no safetensors name", dtype_name(dtype)));
}

DType parse_safetensors_dtype(const std::string& name) {
  for (const auto& entry : kNames)
    if (name == entry.name) return entry.dtype;
  throw DataError(
      fmt::format("dtype '{}' is not one meshtensor reads (F64, F32, BF16, F16, I64, "
                  "I32, U8)",
                  name));
}

const SafetensorsEntry* SafetensorsHeader::find(const std::string& name) const {
  const auto it = std::lower_bound(
      by_name.begin(), by_name.end(), name,
      [this](std::size_t i, const std::string& key) { return entries[i].name < key; });
  return it != by_name.end() && entries[*it].name == name ? &entries[*it] : nullptr;
}

std::string encode_safetensors_header(std::vector<SafetensorsEntry>& entries,
                                      const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header[kMetadataKey] = metadata;
  std::int64_t position = 0;
  for (auto& entry : entries) {
    if (entry.name.empty() || entry.name == kMetadataKey || header.contains(entry.name)) {
      throw InvalidArgument(
          fmt::format("safetensors tensor name '{}' is empty, reserved or repeated", entry.name));
    }
    entry.begin = position;
    entry.end = position + entry.shape.numel() * static_cast<std::int64_t>(dtype_size(entry.dtype));
    position = entry.end;
    header[entry.name] = {{"dtype", safetensors_dtype_name(entry.dtype)},
                          {"shape", entry.shape.dims()},
                          {"data_offsets", {entry.begin, entry.end}}};
  }
  std::string json = header.dump();
  json.append((8 - json.size() % 8) % 8, ' ');
  std::string prefix(8, '\0');
  for (std::size_t i = 0; i < 8; ++i)
    prefix[i] = static_cast<char>((json.size() >> (8 * i)) & 0xFF);
  return prefix + json;
}

namespace {

DataError not_safetensors(const std::string& file, const std::string& problem) {
  return DataError(fmt::format("{} is not a valid safetensors file: {}", file, problem));
}

// The header's JSON object, every tensor name once.
nlohmann::json parse_header_json(std::span<const std::byte> json, const std::string& file) {
  if (json.empty() || json[0] != std::byte{'{'})
    throw not_safetensors(file, "the header does not start with '{'");
  // Repeated names would be silently merged by the JSON library: refuse them while parsing.
  std::set<std::string> names;
  const nlohmann::json::parser_callback_t unique_names =
      [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
        if (event == nlohmann::json::parse_event_t::key && depth == 1 &&
            !names.insert(parsed.get<std::string>()).second) {
          throw not_safetensors(file, fmt::format("tensor '{}' appears twice in the header",
                                                  parsed.get<std::string>()));
        }
        return true;
      };
  const std::string_view text(reinterpret_cast<const char*>(json.data()), json.size());
  nlohmann::json header;
  try {
    header = parse_untrusted_json(text, file + " (header)", unique_names);
  } catch (const DataError& error) {
    throw not_safetensors(file, error.what());
  }
  if (header.is_discarded() || !header.is_object())
    throw not_safetensors(file, "the header is not a JSON object");
  return header;
}

// One tensor's entry: dtype, shape and data offsets, checked against the file's size.
SafetensorsEntry parse_entry(const std::string& name, const nlohmann::json& value,
                             std::int64_t file_bytes, const std::string& file) {
  const auto bad = [&](const std::string& problem) {
    return not_safetensors(file, fmt::format("tensor '{}': {}", name, problem));
  };
  if (!value.is_object() || value.size() != 3 || !value.contains("dtype") ||
      !value.contains("shape") || !value.contains("data_offsets")) {
    throw bad("expected exactly dtype, shape and data_offsets");
  }
  SafetensorsEntry entry;
  entry.name = name;
  if (!value["dtype"].is_string()) throw bad("dtype is not a string");
  try {
    entry.dtype = parse_safetensors_dtype(value["dtype"].get<std::string>());
  } catch (const DataError& error) {
    throw bad(error.what());
  }
  const nlohmann::json& shape = value["shape"];
  if (!shape.is_array()) throw bad("shape is not an array");
  std::vector<std::int64_t> dims;
  for (const auto& dim : shape) {
    if (!dim.is_number_integer() || dim.get<std::int64_t>() < 0)
      throw bad(fmt::format("shape entry {} is not a size >= 0", json_excerpt(dim)));
    dims.push_back(dim.get<std::int64_t>());
  }
  try {
    entry.shape = Shape(dims);
  } catch (const InvalidArgument& error) {
    throw bad(error.what());
  }
  const nlohmann::json& offsets = value["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
      !offsets[1].is_number_unsigned()) {
    throw bad("data_offsets is not [begin, end]");
  }
  const auto begin = offsets[0].get<std::uint64_t>();
  const auto end = offsets[1].get<std::uint64_t>();
  const auto needed = static_cast<std::uint64_t>(entry.shape.numel()) * dtype_size(entry.dtype);
  if (begin > end || end > static_cast<std::uint64_t>(file_bytes) || end - begin != needed) {
    throw bad(fmt::format("data_offsets [{}, {}] do not hold the {} bytes of {} {}", begin, end,
                          needed, value["dtype"].get<std::string>(), entry.shape.to_string()));
  }
  entry.begin = static_cast<std::int64_t>(begin);
  entry.end = static_cast<std::int64_t>(end);
  return entry;
}

// Sorts the entries by position, checks that they tile the data with no gap or overlap and
// fill the file, and indexes them by name.
void lay_out_entries(SafetensorsHeader& result, std::int64_t file_bytes, const std::string& file) {
  std::sort(result.entries.begin(), result.entries.end(),
            [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
              return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
            });
  std::int64_t position = 0;
  for (const auto& entry : result.entries) {
    if (entry.begin != position) {
      throw not_safetensors(
          file,
          fmt::format("tensor '{}' starts at byte {} of the data, expected {} ({})", entry.name,
                      entry.begin, position, entry.begin < position ? "overlap" : "gap"));
    }
    position = entry.end;
  }
  result.data_bytes = position;
  result.by_name.resize(result.entries.size());
  std::iota(result.by_name.begin(), result.by_name.end(), std::size_t{0});
  std::sort(result.by_name.begin(), result.by_name.end(), [&](std::size_t a, std::size_t b) {
    return result.entries[a].name < result.entries[b].name;
  });
  if (result.data_start + result.data_bytes != file_bytes) {
    throw not_safetensors(
        file, fmt::format("the file is {} bytes, but its header describes {} ({})", file_bytes,
                          result.data_start + result.data_bytes,
                          file_bytes < result.data_start + result.data_bytes ? "truncated"
                                                                             : "trailing bytes"));
  }
}

}  // namespace

SafetensorsHeader parse_safetensors_header(std::span<const std::byte> json, std::int64_t file_bytes,
                                           const std::string& file) {
  const nlohmann::json header = parse_header_json(json, file);
  SafetensorsHeader result;
  result.data_start = 8 + static_cast<std::int64_t>(json.size());
  for (const auto& [name, value] : header.items()) {
    if (name == kMetadataKey) {
      if (!value.is_object()) throw not_safetensors(file, "__metadata__ is not an object");
      for (const auto& [key, text_value] : value.items()) {
        if (!text_value.is_string()) {
          throw not_safetensors(file,
                                fmt::format("__metadata__ value of '{}' is not a string", key));
        }
        result.metadata[key] = text_value.get<std::string>();
      }
      continue;
    }
    if (name.empty()) throw not_safetensors(file, "a tensor has an empty name");
    result.entries.push_back(parse_entry(name, value, file_bytes, file));
  }
  lay_out_entries(result, file_bytes, file);
  return result;
}

namespace {

// The JSON header's length from the 8-byte prefix, checked against the file's size.
std::int64_t header_length(const std::byte* prefix, std::int64_t file_bytes,
                           const std::string& name) {
  const std::uint64_t length = load_le64(prefix);
  if (length > static_cast<std::uint64_t>(kMaxSafetensorsHeaderBytes) ||
      static_cast<std::int64_t>(length) > file_bytes - 8) {
    throw DataError(fmt::format(
        "{} is not a valid safetensors file: header length {} does not fit in the {} bytes of "
        "the file (at most {})",
        name, length, file_bytes, kMaxSafetensorsHeaderBytes));
  }
  return static_cast<std::int64_t>(length);
}

void check_prefix(std::int64_t file_bytes, const std::string& name) {
  if (file_bytes < 8) {
    throw DataError(fmt::format(
        "{} is not a valid safetensors file: {} bytes, shorter than the 8-byte header length "
        "(truncated)",
        name, file_bytes));
  }
}

}  // namespace

SafetensorsHeader parse_safetensors_file(std::span<const std::byte> file, const std::string& name) {
  const auto size = static_cast<std::int64_t>(file.size());
  check_prefix(size, name);
  const std::int64_t length = header_length(file.data(), size, name);
  return parse_safetensors_header(file.subspan(8, static_cast<std::size_t>(length)), size, name);
}

SafetensorsHeader read_safetensors_header(const std::string& path) {
  const io::File file = io::File::open_read(path);
  const std::int64_t size = file.size();
  check_prefix(size, path);
  std::byte prefix[8];
  file.read_at(0, prefix);
  std::vector<std::byte> json(static_cast<std::size_t>(header_length(prefix, size, path)));
  file.read_at(8, json);
  return parse_safetensors_header(json, size, path);
}

}  // namespace meshtensor::checkpoint
