#include <fmt/format.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/nn/decode.hpp>

namespace meshtensor::nn {

KeyValueCache::KeyValueCache(std::int64_t slots, std::int64_t heads, std::int64_t head_dim,
                             std::int64_t context)
    : slots_(slots), heads_(heads), head_dim_(head_dim), context_(context) {
  if (slots < 1 || heads < 1 || head_dim < 1 || context < 1) {
    throw InvalidArgument(fmt::format(
        "a key/value cache needs positive sizes, got {} slots, {} heads, head dim {}, context {}",
        slots, heads, head_dim, context));
  }
  const auto size = static_cast<std::size_t>(slots * heads * head_dim * context);
  keys_.resize(size);
  values_.resize(size);
}

float* KeyValueCache::keys_t(std::int64_t slot, std::int64_t head) {
  return keys_.data() + ((slot * heads_ + head) * head_dim_ * context_);
}

float* KeyValueCache::values(std::int64_t slot, std::int64_t head) {
  return values_.data() + ((slot * heads_ + head) * head_dim_ * context_);
}

void check_decode_rows(const Tensor& tokens, const DecodeRows& rows,
                       const std::vector<KeyValueCache>& caches, std::size_t layers) {
  if (tokens.dtype() != DType::i64 || tokens.rank() != 1 || tokens.shape()[0] != rows.size() ||
      rows.positions.size() != rows.slots.size()) {
    throw InvalidArgument(fmt::format("decode: {} rows need i64 tokens [{}], got {} {}",
                                      rows.size(), rows.size(), dtype_name(tokens.dtype()),
                                      tokens.shape().to_string()));
  }
  if (caches.size() != layers)
    throw InvalidArgument(fmt::format("decode: {} caches for {} blocks", caches.size(), layers));
  for (std::size_t r = 0; r < rows.slots.size(); ++r) {
    const std::int64_t slot = rows.slots[r];
    const std::int64_t position = rows.positions[r];
    if (slot < 0 || slot >= caches.front().slots() || position < 0 ||
        position >= caches.front().context()) {
      throw InvalidArgument(
          fmt::format("decode: row {} is slot {} position {}, outside {} slots of {} positions", r,
                      slot, position, caches.front().slots(), caches.front().context()));
    }
  }
}

}  // namespace meshtensor::nn
