#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <meshtensor/mesh/placement.hpp>
#include <meshtensor/nn/models.hpp>
#include <meshtensor/nn/module.hpp>
#include <meshtensor/tp/tensor_parallel.hpp>

namespace meshtensor::tp {

/// How a module is split over a tensor-parallel group: which parameters each rank keeps and
/// where activations change placement at the module's boundary. Activations are [batch,
/// sequence, features]: Replicate, Shard(1) (a sequence shard) or Shard(2) (a feature shard).
class ParallelStyle {
 public:
  virtual ~ParallelStyle() = default;
  /// Splits `module` (at `path`) over `tp`; InvalidArgument naming the path when the style does
  /// not apply to the module. Returns the strategy its product runs with (sharding propagation
  /// of the matmul on the style's placements, e.g. "matmul nn R x S1 -> S2"), or "".
  virtual std::string apply(nn::Module& module, const std::string& path,
                            TensorParallel& tp) const = 0;
  /// E.g. "ColwiseParallel(input=Shard(1))".
  virtual std::string describe() const = 0;
};

/// A Linear split along its output features: W and b by columns. Input Replicate or Shard(1)
/// (gathered before the product); output Shard(2), kept local. Backward, the input gradient's
/// sums over the split features are completed to the input placement (all-reduce or
/// reduce-scatter).
class ColwiseParallel : public ParallelStyle {
 public:
  explicit ColwiseParallel(Placement input = Placement::replicate());
  std::string apply(nn::Module& module, const std::string& path, TensorParallel& tp) const override;
  std::string describe() const override;

 private:
  std::string apply_tied(nn::Linear& linear, const std::string& path, TensorParallel& tp) const;
  Placement input_;
};

/// A Linear split along its input features (W by rows; b whole, added once), or a token
/// embedding split along its rows (the vocabulary). Output Partial, completed to `output`:
/// Replicate (all-reduce) or Shard(1) (reduce-scatter).
class RowwiseParallel : public ParallelStyle {
 public:
  explicit RowwiseParallel(Placement output = Placement::replicate());
  std::string apply(nn::Module& module, const std::string& path, TensorParallel& tp) const override;
  std::string describe() const override;

 private:
  Placement output_;
};

/// A norm (LayerNorm, RMSNorm) computed on row shards: parameters replicated, their gradient sums
/// partial over the group (reduced over it with the data-parallel reduction). Rows are
/// sequence positions (dim 1, "SequenceParallel") or, for a norm of each head's queries or
/// keys, the heads each rank computes (dim 2, "HeadParallel").
class SequenceParallel : public ParallelStyle {
 public:
  explicit SequenceParallel(int rows_dim = 1) : rows_dim_(rows_dim) {}
  std::string apply(nn::Module& module, const std::string& path, TensorParallel& tp) const override;
  std::string describe() const override;

 private:
  int rows_dim_;
};

/// Moves a module's input from `input_layout` to `desired_input_layout` before its forward, and
/// its input gradient back after its backward (e.g. Shard(1) -> Replicate: one all-gather of the
/// sequence shards for a whole block instead of one per layer). Replicate or Shard only: a
/// Partial layout is an InvalidArgument naming it.
class PrepareModuleInput : public ParallelStyle {
 public:
  PrepareModuleInput(Placement input_layout, Placement desired_input_layout);
  std::string apply(nn::Module& module, const std::string& path, TensorParallel& tp) const override;
  std::string describe() const override;

 private:
  Placement from_;
  Placement to_;
};

/// Moves a module's output from `output_layout` to `desired_output_layout` after its forward, and
/// the output gradient back before its backward. Replicate or Shard only.
class PrepareModuleOutput : public ParallelStyle {
 public:
  PrepareModuleOutput(Placement output_layout, Placement desired_output_layout);
  std::string apply(nn::Module& module, const std::string& path, TensorParallel& tp) const override;
  std::string describe() const override;

 private:
  Placement from_;
  Placement to_;
};

/// Module path patterns and their styles; `*` matches one path component or part of it (no dot).
using ParallelizePlan = std::vector<std::pair<std::string, std::shared_ptr<const ParallelStyle>>>;

/// True when `path` matches `pattern` (`*` matches any run of characters other than '.').
bool matches_pattern(const std::string& pattern, const std::string& path);

/// Applies `plan` to the modules under `root`; every parameter no style split is marked
/// replicated over the group (saved by its first member). InvalidArgument for a pattern that
/// matches no module, or a style that does not apply to a module it matches. Returns the
/// (path, "style: strategy") pairs applied, in plan order.
std::vector<std::pair<std::string, std::string>> parallelize_module(nn::Module& root,
                                                                    TensorParallel& tp,
                                                                    const ParallelizePlan& plan);

/// Megatron's plan for the decoder a spec describes: the token embedding split by vocabulary
/// rows, qkv (whole groups of query heads with their key/value head; a GPT's whole heads) and the
/// MLP's first projection (whole blocks) column-parallel, the attention output and the MLP's
/// second projection row-parallel, the LM head column-parallel over the vocabulary (its loss
/// vocabulary-parallel); with sequence parallelism the norms run on sequence shards and the
/// row-parallel outputs are reduce-scattered along the sequence; with QK-norm the query and key
/// norms run on each rank's heads (HeadParallel).
ParallelizePlan decoder_plan(const nn::DecoderSpec& spec, bool sequence_parallel);

/// InvalidArgument naming both numbers unless a decoder of `spec` splits over `degree` ranks:
/// the degree must divide the key/value heads (key/value heads are never replicated), and so
/// the query heads, and the MLP's blocks; the vocabulary must have a row per rank.
void check_decoder_degree(const nn::DecoderSpec& spec, std::int64_t degree);

}  // namespace meshtensor::tp
