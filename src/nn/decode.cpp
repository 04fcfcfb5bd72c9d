#include <fmt/format.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/core/memory.hpp>
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
  keys_.resize(static_cast<std::size_t>(slots));
  values_.resize(static_cast<std::size_t>(slots));
  capacity_.assign(static_cast<std::size_t>(slots), 0);
}

std::int64_t KeyValueCache::capacity(std::int64_t slot) const {
  return capacity_.at(static_cast<std::size_t>(slot));
}

void KeyValueCache::reserve(std::int64_t slot, std::int64_t positions) {
  if (slot < 0 || slot >= slots_ || positions < 1 || positions > context_) {
    throw InvalidArgument(
        fmt::format("a key/value cache of {} slots of at most {} positions "
                    "cannot reserve {} positions for slot {}",
                    slots_, context_, positions, slot));
  }
  const auto at = static_cast<std::size_t>(slot);
  const auto size = static_cast<std::size_t>(heads_ * head_dim_ * positions);
  // Contents are dropped: a fresh request writes every position before it reads it.
  keys_[at] = std::vector<float>(size);
  values_[at] = std::vector<float>(size);
  capacity_[at] = positions;
}

double KeyValueCache::slot_bytes(std::int64_t positions) const {
  return 2.0 * 4.0 * static_cast<double>(heads_ * head_dim_) * static_cast<double>(positions);
}

float* KeyValueCache::keys_t(std::int64_t slot, std::int64_t head) {
  const auto at = static_cast<std::size_t>(slot);
  return keys_[at].data() + head * head_dim_ * capacity_[at];
}

float* KeyValueCache::values(std::int64_t slot, std::int64_t head) {
  const auto at = static_cast<std::size_t>(slot);
  return values_[at].data() + head * head_dim_ * capacity_[at];
}

void check_cache_rows(const DecodeRows& rows, const KeyValueCache& cache) {
  for (std::size_t r = 0; r < rows.slots.size(); ++r) {
    const std::int64_t slot = rows.slots[r];
    const std::int64_t position = rows.positions[r];
    if (slot < 0 || slot >= cache.slots() || position < 0 || position >= cache.capacity(slot)) {
      throw InvalidArgument(fmt::format(
          "decode: row {} is slot {} position {}, outside {} slots of the positions reserved "
          "({})",
          r, slot, position, cache.slots(),
          slot < 0 || slot >= cache.slots() ? 0 : cache.capacity(slot)));
    }
  }
}

void reserve_slot(std::vector<KeyValueCache>& caches, std::int64_t slot, std::int64_t positions) {
  double bytes = 0;
  for (const KeyValueCache& cache : caches)
    bytes += cache.slot_bytes(positions) - cache.slot_bytes(cache.capacity(slot));
  require_memory(bytes, fmt::format("key/value caches for a sequence of {} positions", positions));
  for (KeyValueCache& cache : caches)
    cache.reserve(slot, positions);
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
  check_cache_rows(rows, caches.front());
}

}  // namespace meshtensor::nn
