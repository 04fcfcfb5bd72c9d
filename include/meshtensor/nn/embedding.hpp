#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <meshtensor/nn/decode.hpp>
#include <meshtensor/nn/module.hpp>

namespace meshtensor::nn {

/// A lookup table: forward maps i64 indices [...] to the rows of `weight` [count, dim], f32
/// [..., dim]; backward reports the rows' gradients to the sink (add_indexed_rows) and returns no
/// input gradient (indices have none). Weights start as normal samples times `init_std`.
class Embedding : public Module {
 public:
  /// `seed` makes the initial weights; the same seed gives the same bits everywhere.
  Embedding(std::int64_t count, std::int64_t dim, std::uint64_t seed, double init_std);
  Tensor forward(const Tensor& indices) override;
  Tensor backward(const Tensor& grad_output, GradientSink& sink, bool need_input_grad) override;
  std::vector<Parameter*> parameters() override { return {&weight_}; }
  std::string describe() const override;
  SavedState take_saved() override;
  void restore_saved(SavedState saved) override;
  /// The table ([count, dim]).
  Parameter& weight() { return weight_; }
  /// The table ([count, dim]).
  const Parameter& weight() const { return weight_; }
  /// Makes the table rows [offset, offset + count) of a table of `total` rows (vocabulary
  /// parallelism): indices below `total` are valid, those of other rows give zeros forward and
  /// no gradient. InvalidArgument unless the rows lie inside `total`.
  void set_row_range(std::int64_t offset, std::int64_t total);
  /// Rows of the whole table.
  std::int64_t total_rows() const { return total_rows_; }
  /// Installs the communication of a parallel style (null: none): the output, of the rows this
  /// rank holds, is completed by `split`. It must outlive the module.
  void set_split(SplitCommunication* split) { split_ = split; }
  SplitCommunication* split_communication() const override { return split_; }

 private:
  Parameter weight_;
  SplitCommunication* split_ = nullptr;
  std::int64_t row_offset_ = 0;
  std::int64_t total_rows_ = 0;
  std::vector<std::int64_t> indices_;
  Shape output_shape_;
};

/// i64 token ids [batch, sequence] -> f32 [batch, sequence, dim]: the token's embedding plus
/// the embedding of its position in the sequence (learned; positions below `context`).
class TokenPositionEmbedding : public Module {
 public:
  TokenPositionEmbedding(std::int64_t vocabulary, std::int64_t context, std::int64_t dim,
                         std::uint64_t seed, double init_std);
  Tensor forward(const Tensor& tokens) override;
  Tensor backward(const Tensor& grad_output, GradientSink& sink, bool need_input_grad) override;
  std::vector<Parameter*> parameters() override;
  std::string describe() const override;
  std::vector<std::pair<std::string, Module*>> children() override;
  SplitCommunication* split_communication() const override { return split_; }
  /// The token table.
  Embedding& token() { return token_; }
  /// Installs the communication of a parallel style (null: none): the output is the sum of the
  /// token rows this rank holds and the position rows (the first member adds those), completed
  /// by `split`. It must outlive the module.
  void set_split(SplitCommunication* split) { split_ = split; }
  /// Incremental decoding (null: back to whole sequences): forward takes tokens [1, rows] and
  /// adds the position rows `rows` names instead of 0, 1, ...
  void set_decode(const DecodeRows* rows) { decode_rows_ = rows; }
  /// Context parallelism (null: whole sequences): the rows are the positions `split` gives this
  /// rank, and each adds its own position's row.
  void set_sequence_split(const SequenceSplit* split) { sequence_split_ = split; }

 private:
  SplitCommunication* split_ = nullptr;
  const SequenceSplit* sequence_split_ = nullptr;
  const DecodeRows* decode_rows_ = nullptr;
  Embedding token_;
  Embedding position_;
};

}  // namespace meshtensor::nn
