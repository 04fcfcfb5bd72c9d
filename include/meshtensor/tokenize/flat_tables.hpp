#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace meshtensor::tokenize {

/// A hash of bytes, eight at a time (the tables' and the piece cache's).
inline std::uint64_t hash_bytes(std::string_view s) {
  std::uint64_t h = 0x9E3779B97F4A7C15ull ^ s.size();
  std::size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    std::uint64_t word = 0;
    std::memcpy(&word, s.data() + i, 8);
    h = (h ^ word) * 0xBF58476D1CE4E5B9ull;
    h ^= h >> 31;
  }
  std::uint64_t tail = 0;
  if (i < s.size()) std::memcpy(&tail, s.data() + i, s.size() - i);
  h = (h ^ tail) * 0x94D049BB133111EBull;
  return h ^ (h >> 29);
}

/// A map from 64-bit keys (any but ~0) to 32-bit values in one array, probed linearly: the
/// merges' lookups, which node-based maps make cache-missing.
class PairTable {
 public:
  /// Adds `key` -> `value` unless `key` is there; true when added.
  bool insert(std::uint64_t key, std::int32_t value) {
    if ((size_ + 1) * 2 > slots_.size()) grow();
    std::size_t at = slot_of(key);
    for (; slots_[at].key != kEmpty; at = (at + 1) & (slots_.size() - 1))
      if (slots_[at].key == key) return false;
    slots_[at] = {key, value};
    ++size_;
    return true;
  }
  /// The value of `key`, or -1.
  std::int32_t find(std::uint64_t key) const {
    if (slots_.empty()) return -1;
    for (std::size_t at = slot_of(key);; at = (at + 1) & (slots_.size() - 1)) {
      if (slots_[at].key == key) return slots_[at].value;
      if (slots_[at].key == kEmpty) return -1;
    }
  }
  std::size_t size() const { return size_; }

 private:
  static constexpr std::uint64_t kEmpty = ~std::uint64_t{0};
  struct Slot {
    std::uint64_t key = kEmpty;
    std::int32_t value = 0;
  };
  std::size_t slot_of(std::uint64_t key) const {
    return static_cast<std::size_t>((key * 0x9E3779B97F4A7C15ull) >> shift_);
  }
  void grow() {
    std::vector<Slot> old(slots_.empty() ? 64 : slots_.size() * 2);
    old.swap(slots_);
    shift_ = 64 - static_cast<int>(std::countr_zero(slots_.size()));
    size_ = 0;
    for (const Slot& slot : old)
      if (slot.key != kEmpty) insert(slot.key, slot.value);
  }
  std::vector<Slot> slots_;
  std::size_t size_ = 0;
  int shift_ = 64;
};

/// A map from byte strings to ids, the keys in one buffer: whole-piece lookups without building a
/// string.
class BytesTable {
 public:
  /// Adds `key` -> `id` unless `key` is there.
  void insert(std::string_view key, std::int64_t id) {
    if (find(key) >= 0) return;
    if ((entries_.size() + 1) * 2 > slots_.size()) grow();
    entries_.push_back({hash_bytes(key), keys_.size(), key.size(), id});
    keys_.append(key);
    place(entries_.size() - 1);
  }
  /// The id of `key`, or -1.
  std::int64_t find(std::string_view key) const {
    if (slots_.empty()) return -1;
    const std::uint64_t hash = hash_bytes(key);
    for (std::size_t at = hash & (slots_.size() - 1);; at = (at + 1) & (slots_.size() - 1)) {
      const std::uint32_t e = slots_[at];
      if (e == kEmpty) return -1;
      const Entry& entry = entries_[e];
      if (entry.hash == hash && entry.length == key.size() &&
          std::memcmp(keys_.data() + entry.offset, key.data(), key.size()) == 0)
        return entry.id;
    }
  }

 private:
  static constexpr std::uint32_t kEmpty = ~std::uint32_t{0};
  struct Entry {
    std::uint64_t hash;
    std::size_t offset;
    std::size_t length;
    std::int64_t id;
  };
  void place(std::size_t e) {
    std::size_t at = entries_[e].hash & (slots_.size() - 1);
    while (slots_[at] != kEmpty)
      at = (at + 1) & (slots_.size() - 1);
    slots_[at] = static_cast<std::uint32_t>(e);
  }
  void grow() {
    slots_.assign(slots_.empty() ? 64 : slots_.size() * 2, kEmpty);
    for (std::size_t e = 0; e < entries_.size(); ++e)
      place(e);
  }
  std::vector<std::uint32_t> slots_;
  std::vector<Entry> entries_;
  std::string keys_;
};

}  // namespace meshtensor::tokenize
