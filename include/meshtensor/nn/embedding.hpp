#pragma once

#include <cstdint>
#include <string>
#include <vector>

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
  /// The table ([count, dim]).
  Parameter& weight() { return weight_; }
  /// The table ([count, dim]).
  const Parameter& weight() const { return weight_; }

 private:
  Parameter weight_;
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

 private:
  Embedding token_;
  Embedding position_;
};

}  // namespace meshtensor::nn
