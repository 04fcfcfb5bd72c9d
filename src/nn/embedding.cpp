#include <algorithm>
#include <utility>

#include <fmt/format.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/core/random.hpp>
#include <meshtensor/nn/embedding.hpp>

namespace meshtensor::nn {

Embedding::Embedding(std::int64_t count, std::int64_t dim, std::uint64_t seed, double init_std) {
  if (count <= 0 || dim <= 0)
    throw InvalidArgument(fmt::format("Embedding needs positive sizes, got {} x {}", count, dim));
  if (!(init_std > 0.0 && init_std <= 1e3))
    throw InvalidArgument(fmt::format("Embedding init_std {} is not within (0, 1000]", init_std));
  weight_.name = "weight";
  total_rows_ = count;
  if (WeightsToBeLoaded::active()) {
    weight_.value = Tensor::uninitialized(Shape{count, dim}, DType::f32);
    if (WeightsToBeLoaded::gradients()) weight_.grad = Tensor(weight_.value.shape(), DType::f32);
    return;
  }
  weight_.value = Tensor(Shape{count, dim}, DType::f32);
  auto w = weight_.value.values<float>();
  for (std::size_t i = 0; i < w.size(); ++i)
    w[i] = static_cast<float>(normal_sample(seed, i) * init_std);
  weight_.grad = Tensor(weight_.value.shape(), DType::f32);
  total_rows_ = count;
}

void Embedding::set_row_range(std::int64_t offset, std::int64_t total) {
  const std::int64_t count = weight_.value.shape()[0];
  if (offset < 0 || total < count || offset > total - count) {
    throw InvalidArgument(fmt::format("{}: rows [{}, {}) do not lie in a table of {} rows",
                                      describe(), offset, offset + count, total));
  }
  row_offset_ = offset;
  total_rows_ = total;
}

Tensor Embedding::forward(const Tensor& indices) {
  const std::int64_t count = weight_.value.shape()[0];
  const std::int64_t dim = weight_.value.shape()[1];
  if (!indices.defined() || indices.dtype() != DType::i64 || indices.rank() < 1) {
    throw InvalidArgument(fmt::format("{} needs i64 indices, got {}", describe(),
                                      indices.defined() ? dtype_name(indices.dtype()) : "none"));
  }
  const Tensor dense = indices.contiguous();
  const auto in = dense.values<std::int64_t>();
  indices_.assign(in.begin(), in.end());
  std::vector<std::int64_t> dims = dense.shape().dims();
  dims.push_back(dim);
  output_shape_ = Shape(std::move(dims));
  Tensor output = Tensor::uninitialized(output_shape_, DType::f32);
  auto out = output.values<float>();
  const auto table = weight_.value.values<float>();
  for (std::size_t r = 0; r < indices_.size(); ++r) {
    const std::int64_t index = indices_[r];
    if (index < 0 || index >= total_rows_) {
      throw InvalidArgument(
          fmt::format("{}: index {} is outside [0, {})", describe(), index, total_rows_));
    }
    float* row = out.data() + static_cast<std::int64_t>(r) * dim;
    const std::int64_t local = index - row_offset_;
    if (local >= 0 && local < count) {
      std::copy_n(table.data() + local * dim, dim, row);
    } else {
      std::fill_n(row, dim, 0.0f);
    }
  }
  // Each element has one non-zero term over the ranks: any reduction mode gives its bits.
  return split_ != nullptr ? split_->complete_output({output, nullptr, output.shape()}) : output;
}

Tensor Embedding::backward(const Tensor& given, GradientSink& sink, bool) {
  if (output_shape_.rank() == 0) throw InvalidArgument(describe() + ": backward without a forward");
  const Tensor grad_output = split_ != nullptr ? split_->gather_output_grad(given) : given;
  if (!grad_output.defined() || grad_output.dtype() != DType::f32 ||
      grad_output.shape() != output_shape_) {
    throw InvalidArgument(
        fmt::format("{}: the gradient must be f32 {}", describe(), output_shape_.to_string()));
  }
  const std::int64_t dim = weight_.value.shape()[1];
  const auto rows = static_cast<std::int64_t>(indices_.size());
  const Tensor grad = grad_output.contiguous().reshape(Shape{rows, dim});
  const std::int64_t count = weight_.value.shape()[0];
  if (row_offset_ == 0 && total_rows_ == count) {
    sink.add_indexed_rows(weight_, indices_, grad);
  } else {  // the rows of this rank's part of the table
    std::vector<std::int64_t> local;
    std::vector<std::int64_t> picked;
    for (std::int64_t r = 0; r < rows; ++r) {
      const std::int64_t index = indices_[static_cast<std::size_t>(r)] - row_offset_;
      if (index < 0 || index >= count) continue;
      local.push_back(index);
      picked.push_back(r);
    }
    Tensor kept =
        Tensor::uninitialized(Shape{static_cast<std::int64_t>(picked.size()), dim}, DType::f32);
    const float* from = grad.values<float>().data();
    float* to = kept.values<float>().data();
    for (std::size_t i = 0; i < picked.size(); ++i)
      std::copy_n(from + picked[i] * dim, dim, to + static_cast<std::int64_t>(i) * dim);
    sink.add_indexed_rows(weight_, local, kept);
  }
  indices_.clear();
  output_shape_ = Shape();
  return {};
}

std::string Embedding::describe() const {
  return fmt::format("Embedding({}, {})", weight_.value.shape()[0], weight_.value.shape()[1]);
}

TokenPositionEmbedding::TokenPositionEmbedding(std::int64_t vocabulary, std::int64_t context,
                                               std::int64_t dim, std::uint64_t seed,
                                               double init_std)
    : token_(vocabulary, dim, mix64(seed ^ 0x746f6b656eULL), init_std),
      position_(context, dim, mix64(seed ^ 0x706f73ULL), init_std) {
  token_.weight().name = "token.weight";
  position_.weight().name = "position.weight";
}

Tensor TokenPositionEmbedding::forward(const Tensor& tokens) {
  if (!tokens.defined() || tokens.dtype() != DType::i64 || tokens.rank() != 2) {
    throw InvalidArgument(fmt::format(
        "{} needs i64 tokens [batch, sequence], got {}", describe(),
        tokens.defined()
            ? fmt::format("{} {}", dtype_name(tokens.dtype()), tokens.shape().to_string())
            : std::string("none")));
  }
  const std::int64_t batch = tokens.shape()[0];
  const std::int64_t length = tokens.shape()[1];
  const std::int64_t context = position_.weight().value.shape()[0];
  const std::int64_t whole = sequence_split_ != nullptr ? sequence_split_->length() : length;
  if (decode_rows_ == nullptr && whole > context) {
    throw InvalidArgument(fmt::format("{}: a sequence of {} tokens is longer than the context {}",
                                      describe(), whole, context));
  }
  Tensor positions(Shape{batch, length}, DType::i64);
  auto p = positions.values<std::int64_t>();
  if (decode_rows_ != nullptr) {
    if (batch != 1 || length != decode_rows_->size()) {
      throw InvalidArgument(fmt::format("{}: decoding takes tokens [1, {}], got {}", describe(),
                                        decode_rows_->size(), tokens.shape().to_string()));
    }
    for (std::int64_t i = 0; i < length; ++i) {
      const std::int64_t at = decode_rows_->positions[static_cast<std::size_t>(i)];
      if (at < 0 || at >= context) {
        throw InvalidArgument(
            fmt::format("{}: position {} is outside the context {}", describe(), at, context));
      }
      p[static_cast<std::size_t>(i)] = at;
    }
  } else {
    const std::vector<std::int64_t> rows = row_positions(sequence_split_, batch, length);
    std::copy(rows.begin(), rows.end(), p.begin());
  }
  Tensor x = token_.forward(tokens);
  const Tensor position_rows = position_.forward(positions);
  if (split_ == nullptr || split_->is_first()) {
    auto out = x.values<float>();
    const auto add = position_rows.values<float>();
    for (std::size_t i = 0; i < out.size(); ++i)
      out[i] += add[i];
  }
  // Each element sums at most two non-zero terms, so any reduction mode rounds it the same way.
  return split_ != nullptr ? split_->complete_output({x, nullptr, x.shape()}) : x;
}

Tensor TokenPositionEmbedding::backward(const Tensor& given, GradientSink& sink, bool) {
  const Tensor grad_output = split_ != nullptr ? split_->gather_output_grad(given) : given;
  token_.backward(grad_output, sink, false);
  position_.backward(grad_output, sink, false);
  return {};
}

std::vector<std::pair<std::string, Module*>> TokenPositionEmbedding::children() {
  return {{"token", &token_}, {"position", &position_}};
}

std::vector<Parameter*> TokenPositionEmbedding::parameters() {
  return {&token_.weight(), &position_.weight()};
}

std::string TokenPositionEmbedding::describe() const {
  return fmt::format("TokenPositionEmbedding({}, {}, {})", token_.weight().value.shape()[0],
                     position_.weight().value.shape()[0], token_.weight().value.shape()[1]);
}

SavedState Embedding::take_saved() {
  SavedState saved;
  saved.integers = std::exchange(indices_, {});
  saved.shapes.push_back(std::exchange(output_shape_, Shape()));
  return saved;
}

void Embedding::restore_saved(SavedState saved) {
  indices_ = std::move(saved.integers);
  output_shape_ = std::move(saved.shapes.at(0));
}

}  // namespace meshtensor::nn
