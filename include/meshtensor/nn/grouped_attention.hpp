#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <meshtensor/kernels/rotary.hpp>
#include <meshtensor/nn/decode.hpp>
#include <meshtensor/nn/layers.hpp>

namespace meshtensor::nn {

/// The shape of a GroupedQueryAttention layer.
struct GroupedAttentionConfig {
  std::int64_t dim = 128;
  std::int64_t heads = 4;     ///< query heads H
  std::int64_t kv_heads = 2;  ///< key/value heads K (K divides H; K = H is multi-head)
  std::int64_t context = 128;
  double rope_theta = 10000.0;
  bool qk_norm = false;  ///< Qwen3: an RMSNorm over each head's queries and keys
  double norm_eps = 1e-5;
  std::int64_t head_dim = 0;  ///< values per head (0: dim / heads)
  bool qkv_bias = false;      ///< biases on the queries, keys and values (Qwen2)
  bool out_bias = false;      ///< a bias on the output projection
  kernels::RotaryScaling rope_scaling;
  /// Rotary embeddings of the queries and keys; off for a model whose positions are learned
  /// (a GPT's), whose heads may then be of any width.
  bool rotary = true;
};

/// Values per head of `config`: its head_dim, or dim / heads.
std::int64_t attention_head_dim(const GroupedAttentionConfig& config);

/// Causal self-attention of every decoder over f32 [batch, sequence, dim]: grouped-query
/// attention (K key/value heads, each shared by G = H / K query heads; K = H is a GPT's
/// multi-head attention), rotary position embeddings on queries and keys where the config asks
/// for them (kernels::rotary_forward, position t for row t), an optional
/// RMSNorm of each head's queries and keys before the rotation (Qwen3), and biases where the
/// config asks for them (Qwen2's on q, k, v). Heads are head_dim wide (dim / H unless the config
/// says otherwise, as Qwen3's 128): the output projection takes H · head_dim features to dim.
///
/// Queries, keys and values come from one Linear `qkv` laid out group after group: for group g
/// its G query heads, then its key head, then its value head (head_dim columns each),
/// so a column-parallel split along whole groups keeps each group on one rank (a GPT's per-head
/// q, k, v layout is the case K = H). A key or value gradient is the sum of its group's query
/// heads' in ascending order, on one rank. Every sequence and head is computed on its own in a
/// fixed order: a sequence's output never depends on the batch it is in.
class GroupedQueryAttention : public Module {
 public:
  /// Weights start as normal samples times `init_std`, the output projection's times
  /// `projection_std`; biases start at zero. InvalidArgument naming the values: K not dividing
  /// H, dim not a multiple of H (without a head_dim), an odd head dim (rotary pairs), a context
  /// below 1.
  GroupedQueryAttention(const GroupedAttentionConfig& config, std::uint64_t seed, double init_std,
                        double projection_std);
  Tensor forward(const Tensor& input) override;
  Tensor backward(const Tensor& grad_output, GradientSink& sink, bool need_input_grad) override;
  std::vector<Parameter*> parameters() override;
  std::string describe() const override;
  /// "qkv", "q_norm", "k_norm" (with qk_norm), "proj".
  std::vector<std::pair<std::string, Module*>> children() override;
  SavedState take_saved() override;
  void restore_saved(SavedState saved) override;
  /// Exact-mode sums over whole groups and heads (Linear::set_exact_blocks): the output
  /// projection's sums over the query heads' outputs, qkv's input-gradient sums over the groups'
  /// columns.
  void set_exact_blocks(bool on);
  /// Values per head.
  std::int64_t head_dim() const { return attention_head_dim(config_); }
  /// Query heads per key/value head.
  std::int64_t group_size() const { return config_.heads / config_.kv_heads; }
  /// Groups (key/value heads) this rank computes: all unless a tensor-parallel split holds part
  /// of qkv.
  std::int64_t local_groups() const;
  /// The layer's shape.
  const GroupedAttentionConfig& config() const { return config_; }
  /// Incremental decoding (null `rows`: back to whole sequences): forward takes [1, rows, dim],
  /// stores each row's rotated key and its value in `cache` (K heads: one per group) at its
  /// slot and position, and each query head attends over its group's positions up to its own,
  /// with the kernels of the whole-sequence forward: a row's output has the bits it has there.
  /// Forward only.
  void set_decode(const DecodeRows* rows, KeyValueCache* cache);
  /// Context parallelism (null: whole sequences): the rows are the positions `split` gives this
  /// rank (rotated at those positions), each attends over every earlier position of the whole
  /// sequence, and backward sends the keys' and values' gradients home. A row has the bits it
  /// has in the whole sequence.
  void set_sequence_split(SequenceSplit* split) { split_ = split; }

 private:
  /// Queries [rows, local heads · head_dim], keys and values [rows, local groups · head_dim].
  struct Heads {
    Tensor queries;
    Tensor keys;
    Tensor values;
  };
  /// Splits qkv's output [rows, local qkv columns] into the heads, then normalises (qk_norm)
  /// and rotates the queries and keys at each row's position.
  Heads prepare_heads(const Tensor& qkv, const std::vector<std::int64_t>& positions);
  Tensor forward_decode(const Tensor& input);
  /// The keys and values of the whole sequence [batch, positions, local groups · head_dim]: the
  /// layer's own, or (context parallelism) gathered from the group.
  std::pair<Tensor, Tensor> whole_keys(std::int64_t batch, std::int64_t length);
  /// The heads' outputs [batch, length, local heads · head_dim], row stats kept.
  Tensor attend(std::int64_t batch, std::int64_t length);
  /// Gradients of the rotated queries, keys and values from the heads' output gradient.
  void attend_backward(const Tensor& grad_attended, std::int64_t batch, std::int64_t length,
                       Tensor& grad_q, Tensor& grad_k, Tensor& grad_v) const;
  /// attend_backward's context-parallel form: the query side of this rank's rows, then the key
  /// side of its keys against every query row of the group.
  void split_attend_backward(const Tensor& grad_attended, std::int64_t batch, std::int64_t length,
                             Tensor& grad_q, Tensor& grad_k, Tensor& grad_v);
  /// qkv's output gradient from the queries', keys' and values' (undoing the rotation and the
  /// norms), in the group layout.
  Tensor merge_heads(Tensor& grad_q, Tensor& grad_k, const Tensor& grad_v, GradientSink& sink,
                     std::int64_t batch, std::int64_t length);

  GroupedAttentionConfig config_;
  std::shared_ptr<const kernels::RotaryTable> rotary_;  // shared by the layers; null: none
  Linear qkv_;
  Linear projection_;
  std::unique_ptr<RMSNorm> q_norm_;
  std::unique_ptr<RMSNorm> k_norm_;
  Tensor queries_;    // f32 [rows, local heads · head_dim], normalised and rotated
  Tensor keys_;       // f32 [rows, local groups · head_dim], normalised and rotated
  Tensor values_;     // f32 [rows, local groups · head_dim]
  Tensor row_stats_;  // f32 [batch, local heads, length, 2]: each row's kernels::RowStats
  const DecodeRows* decode_rows_ = nullptr;
  KeyValueCache* cache_ = nullptr;
  SequenceSplit* split_ = nullptr;
};

}  // namespace meshtensor::nn
