#pragma once

#include <cstdint>
#include <vector>

#include <meshtensor/core/tensor.hpp>

namespace meshtensor::nn {

/// Where the rows of an incremental forward lie: the activations are [1, rows, features], and
/// row r is position `positions[r]` of the sequence held in cache slot `slots[r]`. Rows of one
/// slot come in ascending positions; each position follows the slot's earlier ones.
struct DecodeRows {
  std::vector<std::int64_t> slots;
  std::vector<std::int64_t> positions;
  /// Number of rows.
  std::int64_t size() const { return static_cast<std::int64_t>(slots.size()); }
};

/// The keys and values one attention layer computed for the positions of each sequence slot,
/// stored so that kernels::attention_row reads them in place: per (slot, head) the keys
/// transposed [head_dim, capacity] and the values [capacity, head_dim]. A slot holds memory only
/// for the positions reserved for it (a request's prompt and new tokens), so a model of a long
/// context costs what its requests use, not slots x context.
class KeyValueCache {
 public:
  /// `slots` sequences of up to `context` positions of `heads` heads, none reserved yet.
  KeyValueCache(std::int64_t slots, std::int64_t heads, std::int64_t head_dim,
                std::int64_t context);
  /// Sequences it holds.
  std::int64_t slots() const { return slots_; }
  /// Heads per position.
  std::int64_t heads() const { return heads_; }
  /// Values per head.
  std::int64_t head_dim() const { return head_dim_; }
  /// The most positions a slot may hold (the model's context).
  std::int64_t context() const { return context_; }
  /// Positions reserved for `slot` (0: none).
  std::int64_t capacity(std::int64_t slot) const;
  /// Gives `slot` room for positions [0, positions), its earlier contents dropped.
  /// InvalidArgument past the context.
  void reserve(std::int64_t slot, std::int64_t positions);
  /// Bytes reserving `positions` for one slot takes.
  double slot_bytes(std::int64_t positions) const;
  /// Keys of (slot, head), transposed: [head_dim, capacity(slot)].
  float* keys_t(std::int64_t slot, std::int64_t head);
  /// Values of (slot, head): [capacity(slot), head_dim].
  float* values(std::int64_t slot, std::int64_t head);

 private:
  std::int64_t slots_;
  std::int64_t heads_;
  std::int64_t head_dim_;
  std::int64_t context_;
  std::vector<std::vector<float>> keys_;    // per slot
  std::vector<std::vector<float>> values_;  // per slot
  std::vector<std::int64_t> capacity_;      // per slot
};

/// InvalidArgument naming the first row of `rows` whose slot is not `cache`'s or whose position
/// lies past what its slot reserved.
void check_cache_rows(const DecodeRows& rows, const KeyValueCache& cache);

/// Reserves `positions` for `slot` in every cache of `caches` (one per block), first checking
/// that the machine has the memory (ResourceError naming the positions and the bytes).
void reserve_slot(std::vector<KeyValueCache>& caches, std::int64_t slot, std::int64_t positions);

/// Checks the rows of a decode call against one cache per block: i64 tokens [rows], slots in
/// range, positions inside what the slot reserved; InvalidArgument naming the first bad row.
void check_decode_rows(const Tensor& tokens, const DecodeRows& rows,
                       const std::vector<KeyValueCache>& caches, std::size_t layers);

}  // namespace meshtensor::nn
