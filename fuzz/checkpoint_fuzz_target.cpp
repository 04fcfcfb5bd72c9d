// Fuzz target for the checkpoint readers: the safetensors header parser and the index parser.
// Contract checked: every input either parses or throws meshtensor::DataError (any other
// exception escapes and is reported as a crash); a file that parses has entries tiling its data
// section, which ends at the end of the file; an index that parses has blocks tiling each tensor
// and survives a round trip through its JSON text.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <string>

#include <meshtensor/checkpoint/checkpoint.hpp>
#include <meshtensor/checkpoint/safetensors.hpp>
#include <meshtensor/core/error.hpp>

namespace {
void require(bool condition) {
  if (!condition) std::abort();
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace meshtensor::checkpoint;
  const auto bytes = std::as_bytes(std::span<const std::uint8_t>(data, size));
  try {
    const SafetensorsHeader header = parse_safetensors_file(bytes, "input");
    std::int64_t position = 0;
    for (const SafetensorsEntry& entry : header.entries) {
      require(entry.begin == position && entry.end >= entry.begin);
      position = entry.end;
    }
    require(header.data_start + header.data_bytes == static_cast<std::int64_t>(size));
  } catch (const meshtensor::DataError&) {
  }
  try {
    const std::string text(reinterpret_cast<const char*>(data), size);
    const Index index = parse_index(text, "input");
    for (const StoredTensor& tensor : index.tensors) {
      std::int64_t elements = 0;
      for (const StoredBlock& block : tensor.blocks)
        elements += block.shape.numel();
      require(elements == tensor.shape.numel());
    }
    require(parse_index(index.to_json(), "again").to_json() == index.to_json());
  } catch (const meshtensor::DataError&) {
  }
  return 0;
}
