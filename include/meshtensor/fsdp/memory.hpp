#pragma once

#include <array>
#include <cstdint>
#include <mutex>
#include <string>

namespace meshtensor::fsdp {

/// What a rank's training memory is spent on.
enum class MemoryKind : std::uint8_t {
  parameters,       ///< the parameter shards a rank owns (f32)
  gradients,        ///< gradient shards and the f32 / exact accumulators of micro-batches
  optimizer_state,  ///< momentum buffers, moments
  unsharded,        ///< gathered parameters, unsharded gradient sums, collective buffers
  activations,      ///< what forwards keep for their backwards (micro-batches in flight)
};
inline constexpr std::size_t kMemoryKinds = 5;

/// "parameters", "gradients", "optimizer_state", "unsharded" or "activations".
std::string memory_kind_name(MemoryKind kind);

/// Bytes per kind now, and the largest total seen with its split. Every buffer the runtime
/// allocates is added when it is made and removed when it is freed (from any thread).
class MemoryTracker {
 public:
  /// One moment's bytes per kind.
  struct Snapshot {
    std::array<std::int64_t, kMemoryKinds> bytes{};
    /// Sum over the kinds.
    std::int64_t total() const;
    /// Bytes of `kind`.
    std::int64_t of(MemoryKind kind) const { return bytes[static_cast<std::size_t>(kind)]; }
  };

  /// Adds (or, negative, removes) `bytes` of `kind`.
  void add(MemoryKind kind, std::int64_t bytes);
  /// Bytes held now.
  Snapshot current() const;
  /// The moment with the largest total so far.
  Snapshot peak() const;
  /// The largest bytes of each kind on its own so far.
  Snapshot peak_by_kind() const;
  /// Forgets the peaks (they restart from the current bytes).
  void reset_peak();

 private:
  mutable std::mutex mutex_;
  Snapshot current_;
  Snapshot peak_;
  Snapshot peak_by_kind_;
};

}  // namespace meshtensor::fsdp
