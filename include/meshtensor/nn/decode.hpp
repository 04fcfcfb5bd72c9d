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
/// transposed [head_dim, context] and the values [context, head_dim].
class KeyValueCache {
 public:
  /// Room for `slots` sequences of up to `context` positions of `heads` heads.
  KeyValueCache(std::int64_t slots, std::int64_t heads, std::int64_t head_dim,
                std::int64_t context);
  /// Sequences it holds.
  std::int64_t slots() const { return slots_; }
  /// Heads per position.
  std::int64_t heads() const { return heads_; }
  /// Values per head.
  std::int64_t head_dim() const { return head_dim_; }
  /// Positions per sequence.
  std::int64_t context() const { return context_; }
  /// Keys of (slot, head), transposed: [head_dim, context].
  float* keys_t(std::int64_t slot, std::int64_t head);
  /// Values of (slot, head): [context, head_dim].
  float* values(std::int64_t slot, std::int64_t head);

 private:
  std::int64_t slots_;
  std::int64_t heads_;
  std::int64_t head_dim_;
  std::int64_t context_;
  std::vector<float> keys_;
  std::vector<float> values_;
};

/// Checks the rows of a decode call against one cache per block: i64 tokens [rows], slots in
/// range, positions inside the context; InvalidArgument naming the first bad row.
void check_decode_rows(const Tensor& tokens, const DecodeRows& rows,
                       const std::vector<KeyValueCache>& caches, std::size_t layers);

}  // namespace meshtensor::nn
