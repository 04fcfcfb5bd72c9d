#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include <meshtensor/core/dtype.hpp>
#include <meshtensor/core/shape.hpp>

namespace meshtensor::checkpoint {

/// The safetensors name of a dtype: "F64", "F32", "BF16", "F16", "I64", "I32", "U8".
std::string safetensors_dtype_name(DType dtype);
/// The dtype of a safetensors name; DataError naming the text when meshtensor has no such dtype.
DType parse_safetensors_dtype(const std::string& name);

/// One tensor of a safetensors file: its bytes are [begin, end) of the data section, which
/// starts right after the header.
struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;
  std::int64_t begin = 0;
  std::int64_t end = 0;
  friend bool operator==(const SafetensorsEntry&, const SafetensorsEntry&) = default;
};

/// The header of a safetensors file: its entries in data order, the string map under
/// "__metadata__", and where the data section lies.
struct SafetensorsHeader {
  std::vector<SafetensorsEntry> entries;
  std::map<std::string, std::string> metadata;
  std::int64_t data_start = 0;  ///< 8 + the length of the JSON header
  std::int64_t data_bytes = 0;  ///< bytes of the data section (the end of the last entry)
  /// The entry named `name`, or nullptr (a binary search of by_name).
  const SafetensorsEntry* find(const std::string& name) const;
  /// Indexes into `entries` in name order.
  std::vector<std::size_t> by_name;
};

/// Largest JSON header accepted (as the reference implementation: 100 MB).
inline constexpr std::int64_t kMaxSafetensorsHeaderBytes = 100'000'000;

/// The file prefix (8-byte little-endian length, JSON header padded with spaces to a multiple of
/// 8 bytes) for `entries` written back to back in the given order, with offsets filled in; the
/// data follows with no gaps. InvalidArgument on an empty or repeated name or "__metadata__".
std::string encode_safetensors_header(std::vector<SafetensorsEntry>& entries,
                                      const std::map<std::string, std::string>& metadata);

/// Parses the JSON header `json` of a file of `file_bytes` bytes (`file` names it in errors) and
/// checks it against the specification: a JSON object; no repeated names; every entry with a
/// known dtype, a shape of sizes >= 0 and data_offsets [begin, end] with end - begin the bytes
/// the shape and dtype need; the entries tiling the data section with no gap or overlap; the
/// data section ending exactly at the end of the file (so a truncated or extended file is
/// refused). DataError naming the file and the problem otherwise.
SafetensorsHeader parse_safetensors_header(std::span<const std::byte> json, std::int64_t file_bytes,
                                           const std::string& file);

/// Parses the header of the whole safetensors file held in `file` (`name` names it in errors):
/// the length prefix, then parse_safetensors_header().
SafetensorsHeader parse_safetensors_file(std::span<const std::byte> file, const std::string& name);

/// Reads and parses the header of the safetensors file at `path` (DataError when it cannot be
/// opened or read, or is not valid safetensors).
SafetensorsHeader read_safetensors_header(const std::string& path);

}  // namespace meshtensor::checkpoint
