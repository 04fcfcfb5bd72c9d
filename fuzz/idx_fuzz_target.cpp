// Fuzz target for the IDX reader behind `meshtensor train --data` (gzip or plain bytes).
// Contract checked: every input either parses or throws meshtensor::DataError (any other
// exception escapes and is reported as a crash); what parses has positive dims whose product is
// the number of elements.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#include <meshtensor/core/error.hpp>
#include <meshtensor/train/dataset.hpp>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto bytes = std::as_bytes(std::span<const std::uint8_t>(data, size));
  for (const int dims : {1, 3}) {
    try {
      const meshtensor::train::IdxArray array = meshtensor::train::parse_idx(bytes, dims, "input");
      std::int64_t elements = 1;
      for (const std::int64_t d : array.dims) {
        if (d <= 0) std::abort();
        elements *= d;
      }
      if (static_cast<std::int64_t>(array.data.size()) != elements ||
          static_cast<int>(array.dims.size()) != dims) {
        std::abort();
      }
    } catch (const meshtensor::DataError&) {
    }
  }
  return 0;
}
