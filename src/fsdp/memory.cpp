#include <meshtensor/core/enum_names.hpp>
#include <meshtensor/fsdp/memory.hpp>

namespace meshtensor::fsdp {

std::string memory_kind_name(MemoryKind kind) {
  static constexpr std::array<const char*, kMemoryKinds> kNames = {
      "parameters", "gradients", "optimizer_state", "unsharded", "activations"};
  return kNames.at(static_cast<std::size_t>(kind));
}

std::int64_t MemoryTracker::Snapshot::total() const {
  std::int64_t sum = 0;
  for (const std::int64_t b : bytes)
    sum += b;
  return sum;
}

void MemoryTracker::add(MemoryKind kind, std::int64_t bytes) {
  const std::lock_guard lock(mutex_);
  const auto k = static_cast<std::size_t>(kind);
  current_.bytes[k] += bytes;
  if (current_.bytes[k] > peak_by_kind_.bytes[k]) peak_by_kind_.bytes[k] = current_.bytes[k];
  if (current_.total() > peak_.total()) peak_ = current_;
}

MemoryTracker::Snapshot MemoryTracker::current() const {
  const std::lock_guard lock(mutex_);
  return current_;
}

MemoryTracker::Snapshot MemoryTracker::peak() const {
  const std::lock_guard lock(mutex_);
  return peak_;
}

MemoryTracker::Snapshot MemoryTracker::peak_by_kind() const {
  const std::lock_guard lock(mutex_);
  return peak_by_kind_;
}

void MemoryTracker::reset_peak() {
  const std::lock_guard lock(mutex_);
  peak_ = current_;
  peak_by_kind_ = current_;
}

}  // namespace meshtensor::fsdp
