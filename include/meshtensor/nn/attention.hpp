#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <meshtensor/nn/decode.hpp>
#include <meshtensor/nn/layers.hpp>

namespace meshtensor::nn {

/// Multi-head causal self-attention over f32 [batch, sequence, dim]: qkv = x·W_qkv + b (one
/// Linear to 3·dim, head after head: each head's query, key and value columns, dim / heads each,
/// side by side, so a column-parallel split along whole heads keeps each head on one rank), each
/// head's rows attend to the rows at or before them (kernels::attention_row, scale
/// 1/sqrt(head dim)), and the heads' outputs, side by side, go through the output projection.
/// Every sequence and head is computed on its own in a fixed order, so a sequence's output never
/// depends on the batch it is in, its place there or the thread count.
class CausalSelfAttention : public Module {
 public:
  /// Weights start as normal samples times `init_std`, the output projection's times
  /// `projection_std`.
  CausalSelfAttention(std::int64_t dim, std::int64_t heads, std::uint64_t seed, double init_std,
                      double projection_std);
  Tensor forward(const Tensor& input) override;
  Tensor backward(const Tensor& grad_output, GradientSink& sink, bool need_input_grad) override;
  std::vector<Parameter*> parameters() override;
  std::string describe() const override;
  /// Number of heads (of the whole layer; a rank holding part of qkv computes its heads only).
  std::int64_t heads() const { return heads_; }
  std::vector<std::pair<std::string, Module*>> children() override;
  SavedState take_saved() override;
  void restore_saved(SavedState saved) override;
  /// Exact-mode sums over whole heads (Linear::set_exact_blocks): the output projection's sums
  /// over the heads' outputs and qkv's input-gradient sums over the heads' columns.
  void set_exact_blocks(bool on);
  /// Incremental decoding (null `rows`: back to whole sequences): forward takes [1, rows,
  /// dim], stores each row's keys and values in `cache` at its slot and position, and each row
  /// attends over its slot's positions up to its own, with the kernels of the whole-sequence
  /// forward: a row's output has the bits it has there. Forward only.
  void set_decode(const DecodeRows* rows, KeyValueCache* cache);
  /// Heads this rank computes (all of them unless a tensor-parallel split holds part of qkv).
  std::int64_t local_heads() const;
  /// Values per head.
  std::int64_t head_dim() const { return dim_ / heads_; }
  /// Context parallelism (null: whole sequences): the rows are the positions `split` gives this
  /// rank, each attends over every earlier position of the whole sequence, and backward sends
  /// the keys' and values' gradients home. A row has the bits it has in the whole sequence.
  void set_sequence_split(SequenceSplit* split);

 private:
  /// Where every head's keys and values of the whole sequence lie: the layer's own qkv rows, or
  /// (context parallelism) tensors gathered from the group.
  struct KeySource {
    const float* keys = nullptr;
    const float* values = nullptr;
    Tensor whole_keys;
    Tensor whole_values;
    std::int64_t length = 0;  ///< positions of the whole sequence
    std::int64_t stride = 0;  ///< values per row
    std::int64_t key_column = 0;
    std::int64_t value_column = 0;
    std::int64_t head_step = 0;  ///< columns from one head to the next
    /// Head h of sequence b's keys [length, head_dim] (transposed: [head_dim, length]).
    void keys_of(std::int64_t b, std::int64_t h, std::int64_t head_dim, bool transpose,
                 std::vector<float>& out) const;
    /// Head h of sequence b's values, as keys_of lays them out.
    void values_of(std::int64_t b, std::int64_t h, std::int64_t head_dim, bool transpose,
                   std::vector<float>& out) const;
  };
  KeySource key_source();
  Tensor whole_backward(const Tensor& grad_attended) const;
  Tensor split_backward(const Tensor& grad_attended);
  Tensor forward_decode(const Tensor& input);

  std::int64_t dim_;
  std::int64_t heads_;
  Linear qkv_;
  Linear projection_;
  Tensor qkv_values_;  // f32 [batch, sequence, 3 dim] of the last forward
  Tensor row_stats_;   // f32 [batch, heads, sequence, 2]: each row's kernels::RowStats
  const DecodeRows* decode_rows_ = nullptr;
  KeyValueCache* cache_ = nullptr;
  SequenceSplit* split_ = nullptr;
};

}  // namespace meshtensor::nn
