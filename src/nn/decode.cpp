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

}  // namespace meshtensor::nn
