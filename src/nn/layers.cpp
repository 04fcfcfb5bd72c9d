#include <cmath>
#include <utility>

#include <fmt/format.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/core/profile.hpp>
#include <meshtensor/core/random.hpp>
#include <meshtensor/kernels/activation.hpp>
#include <meshtensor/kernels/binned_sum.hpp>
#include <meshtensor/kernels/elementwise.hpp>
#include <meshtensor/kernels/matmul.hpp>
#include <meshtensor/nn/layers.hpp>

#include "norm_rows.hpp"

namespace meshtensor::nn {

void check_input(const Tensor& input, std::int64_t features, const std::string& module) {
  if (!input.defined() || input.rank() < 2 || input.dtype() != DType::f32 ||
      input.shape()[input.rank() - 1] != features) {
    throw InvalidArgument(fmt::format("{} needs f32 [..., rows, {}] input, got {} {}", module,
                                      features,
                                      input.defined() ? dtype_name(input.dtype()) : "undefined",
                                      input.defined() ? input.shape().to_string() : ""));
  }
}

void add_into(Tensor& a, const Tensor& b) {
  auto x = a.values<float>();
  const auto y = b.values<float>();
  for (std::size_t i = 0; i < x.size(); ++i)
    x[i] += y[i];
}

namespace {

/// `shape` with its last dim replaced by `features`.
Shape with_features(const Shape& shape, std::int64_t features) {
  std::vector<std::int64_t> dims = shape.dims();
  dims.back() = features;
  return Shape(std::move(dims));
}

void check_grad(const Tensor& grad, const Tensor& kept, const std::string& module) {
  if (!kept.defined()) throw InvalidArgument(module + ": backward without a forward");
  if (!grad.defined() || grad.dtype() != DType::f32 || grad.shape() != kept.shape()) {
    throw InvalidArgument(fmt::format("{}: the gradient must be f32 {}, got {}", module,
                                      kept.shape().to_string(),
                                      grad.defined() ? grad.shape().to_string() : "undefined"));
  }
}

}  // namespace

Linear::Linear(std::int64_t in_features, std::int64_t out_features, std::uint64_t seed,
               double init_std, bool bias)
    : has_bias_(bias) {
  if (in_features <= 0 || out_features <= 0) {
    throw InvalidArgument(
        fmt::format("Linear needs positive sizes, got {} -> {}", in_features, out_features));
  }
  weight_.name = "weight";
  if (!(init_std >= 0.0 && init_std <= 1e3))
    throw InvalidArgument(fmt::format("Linear init_std {} is not within [0, 1000]", init_std));
  if (has_bias_) bias_.name = "bias";
  if (WeightsToBeLoaded::active()) {
    weight_.value = Tensor::uninitialized(Shape{in_features, out_features}, DType::f32);
    if (has_bias_) bias_.value = Tensor::uninitialized(Shape{out_features}, DType::f32);
    if (WeightsToBeLoaded::gradients()) {
      weight_.grad = Tensor(weight_.value.shape(), DType::f32);
      if (has_bias_) bias_.grad = Tensor(bias_.value.shape(), DType::f32);
    }
    return;
  }
  weight_.value = Tensor(Shape{in_features, out_features}, DType::f32);
  const double scale =
      init_std > 0.0 ? init_std : std::sqrt(2.0 / static_cast<double>(in_features));
  auto w = weight_.value.values<float>();
  for (std::size_t i = 0; i < w.size(); ++i)
    w[i] = static_cast<float>(normal_sample(seed, i) * scale);
  weight_.grad = Tensor(weight_.value.shape(), DType::f32);
  if (!has_bias_) return;
  bias_.value = Tensor(Shape{out_features}, DType::f32);
  bias_.grad = Tensor(bias_.value.shape(), DType::f32);
}

std::vector<Parameter*> Linear::parameters() {
  if (tied_ != nullptr) return {};
  if (!has_bias_) return {&weight_};
  return {&weight_, &bias_};
}

void Linear::set_exact_blocks(std::int64_t in_blocks, std::int64_t out_blocks) {
  const auto check = [](std::int64_t blocks, std::int64_t size, const char* which) {
    if (blocks == kEveryColumn || blocks == 0) return;
    if (blocks < 0 || size % blocks != 0) {
      throw InvalidArgument(
          fmt::format("Linear: {} {} features do not split into {} blocks", size, which, blocks));
    }
  };
  check(in_blocks, weight_shape()[0], "input");
  check(out_blocks, weight_shape()[1], "output");
  if (in_blocks == kEveryColumn)
    throw InvalidArgument("Linear: the input blocks must be a positive count");
  in_blocks_ = in_blocks;
  out_blocks_ = out_blocks;
}

namespace {

/// `t` as f32 (a bf16 operand's values are exact in it).
Tensor as_f32(const Tensor& t) {
  return kernels::as_dtype(t, DType::f32);
}

/// [rows, columns] f32 -> [columns, rows], in tiles that stay in cache.
Tensor transposed(const Tensor& matrix) {
  const Tensor m = matrix.contiguous();
  const std::int64_t rows = m.shape()[0];
  const std::int64_t columns = m.shape()[1];
  Tensor out = Tensor::uninitialized(Shape{columns, rows}, DType::f32);
  const float* in = m.values<float>().data();
  float* o = out.values<float>().data();
  constexpr std::int64_t kTile = 32;
  for (std::int64_t r0 = 0; r0 < rows; r0 += kTile) {
    for (std::int64_t c0 = 0; c0 < columns; c0 += kTile) {
      for (std::int64_t r = r0; r < std::min(rows, r0 + kTile); ++r)
        for (std::int64_t c = c0; c < std::min(columns, c0 + kTile); ++c)
          o[c * rows + r] = in[r * columns + c];
    }
  }
  return out;
}

kernels::Transpose flipped(kernels::Transpose t) {
  return t == kernels::Transpose::no ? kernels::Transpose::yes : kernels::Transpose::no;
}

/// Adds each element of `values` (f32, any shape) to the matching element of `sums` once.
void add_elements(kernels::BinnedSums& sums, const Tensor& values, kernels::Start start) {
  kernels::add_column_sums(sums, 0, values.reshape(Shape{1, values.numel()}), start);
}

}  // namespace

namespace {
thread_local const BatchVariantScope* innermost_batch_variant = nullptr;
}  // namespace

BatchVariantScope::BatchVariantScope(MatmulOverride matmul)
    : matmul_(std::move(matmul)), outer_(innermost_batch_variant) {
  innermost_batch_variant = this;
}

BatchVariantScope::~BatchVariantScope() {
  innermost_batch_variant = outer_;
}

const BatchVariantScope* BatchVariantScope::active() {
  return innermost_batch_variant;
}

void Linear::tie_weight_to(Parameter& table) {
  const Shape w = weight_.value.shape();
  if (has_bias_ || table.value.rank() != 2 || table.value.shape()[0] != w[1] ||
      table.value.shape()[1] != w[0]) {
    throw InvalidArgument(
        fmt::format("{}: only a layer without a bias ties to a table of [{}, {}], "
                    "not '{}' {}",
                    describe(), w[1], w[0], table.name, table.value.shape().to_string()));
  }
  tied_ = &table;
  tied_shape_ = w;
  // W is the table read transposed by the products: no copy of it is made or held.
  weight_.value = Tensor();
  weight_.grad = Tensor();
}

void Linear::refresh_tied_weight() {
  if (tied_ != nullptr && tied_->value.defined())
    tied_shape_ = Shape{tied_->value.shape()[1], tied_->value.shape()[0]};
}

Shape Linear::weight_shape() const {
  return tied_ != nullptr ? tied_shape_ : weight_.value.shape();
}

void Linear::set_compute_dtype(DType dtype) {
  if (dtype != DType::f32 && dtype != DType::bf16) {
    throw InvalidArgument(
        fmt::format("{}: compute dtype {} is not f32 or bf16", describe(), dtype_name(dtype)));
  }
  compute_dtype_ = dtype;
}

Tensor Linear::in_compute_dtype(const Tensor& t) const {
  if (t.dtype() == compute_dtype_) return t;
  const ProfileScope profile(ProfileRow::matmul);  // the products' own rounding of operands
  return kernels::convert(t, compute_dtype_);
}

Linear::WeightOperand Linear::weight_operand() const {
  if (tied_ == nullptr) return {in_compute_dtype(weight_.value), kernels::Transpose::no};
  if (!tied_->value.defined()) {
    throw InvalidArgument(
        fmt::format("{}: the tied table '{}' holds no values", describe(), tied_->name));
  }
  return {in_compute_dtype(tied_->value), kernels::Transpose::yes};
}

Linear::WeightOperand Linear::weight_rows(std::int64_t first, std::int64_t count) const {
  const WeightOperand w = weight_operand();
  if (tied_ == nullptr) return {w.matrix.narrow(0, first, count), w.transpose};
  return {w.matrix.narrow(1, first, count).contiguous(), w.transpose};
}

Linear::WeightOperand Linear::weight_columns(std::int64_t first, std::int64_t count) const {
  const WeightOperand w = weight_operand();
  if (tied_ == nullptr) return {w.matrix.narrow(1, first, count).contiguous(), w.transpose};
  return {w.matrix.narrow(0, first, count), w.transpose};
}

bool Linear::adds_bias() const {
  if (!has_bias_) return false;
  return split_ == nullptr || !split_->output_is_partial() || split_->is_first();
}

void Linear::fill_bias_rows(Tensor& output) const {
  const auto bias = bias_.value.values<float>();
  auto y = output.values<float>();
  const auto out = static_cast<std::int64_t>(bias.size());
  for (std::int64_t r = 0; r < output.shape()[0]; ++r)
    std::copy(bias.begin(), bias.end(), y.begin() + r * out);
}

Tensor Linear::product() const {
  const Tensor output =
      Tensor::uninitialized(Shape{input_.shape()[0], weight_shape()[1]}, DType::f32);
  const WeightOperand w = weight_operand();
  // Each chain starts from the bias (or +0), as fill_bias_rows and an accumulating matmul do.
  if (adds_bias()) {
    kernels::matmul_bias(input_, kernels::Transpose::no, w.matrix, w.transpose,
                         bias_.value.contiguous(), output);
  } else {
    kernels::matmul(input_, kernels::Transpose::no, w.matrix, w.transpose, output);
  }
  return output;
}

Tensor Linear::variant_product(const BatchVariantScope& variant) const {
  const std::int64_t in = weight_shape()[0];
  const std::int64_t rows = input_.shape()[0];
  Tensor output = Tensor::zeros(Shape{rows, weight_shape()[1]}, DType::f32);
  if (adds_bias()) fill_bias_rows(output);
  const WeightOperand w = weight_operand();
  if (variant.matmul()) {
    variant.matmul()(as_f32(input_), tied_ != nullptr ? transposed(as_f32(w.matrix)) : w.matrix,
                     output);
  } else if (rows > 1 && in > 1) {
    // Two half sums added: the bits depend on whether the call had one row or more.
    const std::int64_t half = in / 2;
    Tensor second = Tensor::zeros(output.shape(), DType::f32);
    const WeightOperand first_rows = weight_rows(0, half);
    const WeightOperand last_rows = weight_rows(half, in - half);
    kernels::matmul(input_.narrow(1, 0, half).contiguous(), kernels::Transpose::no,
                    first_rows.matrix.contiguous(), first_rows.transpose, output,
                    /*accumulate=*/true);
    kernels::matmul(input_.narrow(1, half, in - half).contiguous(), kernels::Transpose::no,
                    last_rows.matrix.contiguous(), last_rows.transpose, second);
    auto y = output.values<float>();
    const auto z = second.values<float>();
    for (std::size_t i = 0; i < y.size(); ++i)
      y[i] += z[i];
  } else {
    kernels::matmul(input_, kernels::Transpose::no, w.matrix, w.transpose, output,
                    /*accumulate=*/true);
  }
  return output;
}

std::vector<Tensor> Linear::forward_addends() const {
  const std::int64_t rows = input_.shape()[0];
  const std::int64_t in = weight_shape()[0];
  const std::int64_t out = weight_shape()[1];
  const std::int64_t width = in / in_blocks_;
  std::vector<Tensor> addends;
  for (std::int64_t b = 0; b < in_blocks_; ++b) {
    Tensor product = Tensor::uninitialized(Shape{rows, out}, DType::f32);
    const WeightOperand block = weight_rows(b * width, width);
    kernels::matmul(input_.narrow(1, b * width, width).contiguous(), kernels::Transpose::no,
                    block.matrix.contiguous(), block.transpose, product);
    addends.push_back(std::move(product));
  }
  if (adds_bias()) {
    Tensor bias_rows = Tensor::uninitialized(Shape{rows, out}, DType::f32);
    fill_bias_rows(bias_rows);
    addends.push_back(std::move(bias_rows));
  }
  return addends;
}

namespace {

/// The addends' exact sums (each element its own): rounded here when nothing else joins them
/// (the verified fast path, the digits' bits), else added into `sums` for the split to complete.
PartialSums sum_addends(const std::vector<Tensor>& addends, bool whole, kernels::BinnedSums& sums,
                        Shape shape) {
  if (whole) {
    Tensor rounded = Tensor::uninitialized(shape, DType::f32);
    kernels::round_element_sums(addends, 1, rounded);
    return {rounded, nullptr, shape};
  }
  for (std::size_t b = 0; b < addends.size(); ++b)
    add_elements(sums, addends[b], b == 0 ? kernels::Start::empty : kernels::Start::sums);
  return {Tensor(), &sums, shape};
}

}  // namespace

PartialSums Linear::forward_sums(kernels::BinnedSums& sums) const {
  return sum_addends(forward_addends(), split_ == nullptr, sums,
                     with_features(input_shape_, weight_shape()[1]));
}

std::vector<Tensor> Linear::input_grad_addends(const Tensor& dy) const {
  const std::int64_t rows = input_.shape()[0];
  const std::int64_t in = weight_shape()[0];
  const std::int64_t width = weight_shape()[1] / out_blocks_;
  std::vector<Tensor> addends;
  for (std::int64_t b = 0; b < out_blocks_; ++b) {
    Tensor product = Tensor::uninitialized(Shape{rows, in}, DType::f32);
    const WeightOperand block = weight_columns(b * width, width);
    kernels::matmul(dy.narrow(1, b * width, width).contiguous(), kernels::Transpose::no,
                    block.matrix.contiguous(), flipped(block.transpose), product);
    addends.push_back(std::move(product));
  }
  return addends;
}

PartialSums Linear::input_grad_sums(const Tensor& dy, kernels::BinnedSums& sums) const {
  if (out_blocks_ != kEveryColumn)
    return sum_addends(input_grad_addends(dy), split_ == nullptr, sums, input_shape_);
  // Wᵀ: the table itself for a tied layer. The outer products' exact sums read f32 (bf16 values
  // are exact in it).
  const WeightOperand w = weight_operand();
  const Tensor terms = transposed(as_f32(dy));
  const Tensor weights = tied_ != nullptr ? as_f32(w.matrix) : transposed(as_f32(w.matrix));
  if (split_ == nullptr) {
    Tensor rounded = Tensor::uninitialized(input_shape_, DType::f32);
    kernels::round_outer_products(terms, weights, 1, rounded);
    return {rounded, nullptr, input_shape_};
  }
  kernels::add_outer_products(sums, 0, terms, weights, kernels::Start::empty);
  return {Tensor(), &sums, input_shape_};
}

void Linear::keep_input(const Tensor& input) {
  refresh_tied_weight();
  const std::int64_t in = weight_shape()[0];
  check_input(input, in, describe());
  input_shape_ = input.shape();
  input_ = in_compute_dtype(input.contiguous().reshape(Shape{input.numel() / in, in}));
}

void Linear::forward_for_backward(const Tensor& given) {
  keep_input(split_ != nullptr ? split_->gather_input(given) : given);
  if (split_ != nullptr) split_->skip_output(with_features(input_shape_, weight_shape()[1]));
}

Tensor Linear::forward(const Tensor& given) {
  keep_input(split_ != nullptr ? split_->gather_input(given) : given);
  const std::int64_t out = weight_shape()[1];
  const std::int64_t rows = input_.shape()[0];
  PartialSums partial;
  kernels::BinnedSums sums;
  if (in_blocks_ > 0) {
    if (split_ != nullptr) sums = kernels::BinnedSums::uninitialized(rows * out);
    partial = forward_sums(sums);
  } else {
    const BatchVariantScope* variant = BatchVariantScope::active();
    const Tensor output = variant != nullptr ? variant_product(*variant) : product();
    partial.values = output.reshape(with_features(input_shape_, out));
  }
  return split_ != nullptr ? split_->complete_output(partial) : round_partial(partial);
}

Tensor Linear::backward(const Tensor& given, GradientSink& sink, bool need_input_grad) {
  if (!input_.defined()) throw InvalidArgument(describe() + ": backward without a forward");
  const Tensor grad_output = split_ != nullptr ? split_->gather_output_grad(given) : given;
  const Shape expected = with_features(input_shape_, weight_shape()[1]);
  if (!grad_output.defined() || grad_output.dtype() != DType::f32 ||
      grad_output.shape() != expected) {
    throw InvalidArgument(
        fmt::format("{}: the gradient must be f32 {}", describe(), expected.to_string()));
  }
  const Tensor dy_f32 =
      grad_output.contiguous().reshape(Shape{input_.shape()[0], weight_shape()[1]});
  const Tensor dy = in_compute_dtype(dy_f32);  // the products' operand
  // Rows come in samples of the positions of one sequence ([batch, sequence, in] inputs).
  const std::int64_t sample_rows =
      input_shape_.rank() >= 3 && input_shape_[0] > 0 ? input_.shape()[0] / input_shape_[0] : 1;
  if (tied_ != nullptr) {
    sink.add_sample_outer_products(*tied_, dy, input_, sample_rows);  // grad(table) += dyᵀ·x
  } else {
    sink.add_sample_outer_products(weight_, input_, dy, sample_rows);
  }
  if (has_bias_) sink.add_column_sums(bias_, dy_f32);
  Tensor grad_input;
  if (need_input_grad) {
    PartialSums partial;
    kernels::BinnedSums sums;
    if (out_blocks_ != 0) {
      if (split_ != nullptr) sums = kernels::BinnedSums::uninitialized(input_.numel());
      partial = input_grad_sums(dy, sums);
    } else {
      Tensor product = Tensor::uninitialized(input_.shape(), DType::f32);
      const WeightOperand w = weight_operand();
      kernels::matmul(dy, kernels::Transpose::no, w.matrix, flipped(w.transpose), product);
      partial.values = product.reshape(input_shape_);
    }
    grad_input = split_ != nullptr ? split_->complete_input_grad(partial) : round_partial(partial);
  }
  input_ = Tensor();
  return grad_input;
}

void set_compute_dtype(Module& root, DType dtype) {
  for (const auto& [path, module] : named_modules(root)) {
    (void)path;
    if (auto* linear = dynamic_cast<Linear*>(module)) linear->set_compute_dtype(dtype);
  }
}

std::string Linear::describe() const {
  return fmt::format("Linear({}, {}{}{})", weight_shape()[0], weight_shape()[1],
                     has_bias_ ? "" : ", bias=false", tied_ != nullptr ? ", tied" : "");
}

Tensor ReLU::forward(const Tensor& input) {
  input_ = input.contiguous();
  Tensor output = Tensor::uninitialized(input.shape(), DType::f32);
  const auto x = input_.values<float>();
  auto y = output.values<float>();
  for (std::size_t i = 0; i < x.size(); ++i)
    y[i] = x[i] > 0.0f || x[i] != x[i] ? x[i] : 0.0f;
  return output;
}

Tensor ReLU::backward(const Tensor& grad_output, GradientSink&, bool need_input_grad) {
  check_grad(grad_output, input_, "ReLU");
  Tensor grad_input;
  if (need_input_grad) {
    const Tensor dy = grad_output.contiguous();
    grad_input = Tensor::uninitialized(dy.shape(), DType::f32);
    const auto x = input_.values<float>();
    const auto g = dy.values<float>();
    auto out = grad_input.values<float>();
    for (std::size_t i = 0; i < x.size(); ++i)
      out[i] = x[i] > 0.0f ? g[i] : 0.0f;
  }
  input_ = Tensor();
  return grad_input;
}

Tensor GELU::forward(const Tensor& input) {
  const ProfileScope profile(ProfileRow::norms_activations);
  input_ = input.contiguous();
  Tensor output = Tensor::uninitialized(input.shape(), DType::f32);
  kernels::gelu_forward(input_.values<float>().data(), output.values<float>().data(),
                        input_.numel());
  return output;
}

Tensor GELU::backward(const Tensor& grad_output, GradientSink&, bool need_input_grad) {
  const ProfileScope profile(ProfileRow::norms_activations);
  check_grad(grad_output, input_, "GELU");
  Tensor grad_input;
  if (need_input_grad) {
    const Tensor dy = grad_output.contiguous();
    grad_input = Tensor::uninitialized(dy.shape(), DType::f32);
    kernels::gelu_backward(input_.values<float>().data(), dy.values<float>().data(),
                           grad_input.values<float>().data(), dy.numel());
  }
  input_ = Tensor();
  return grad_input;
}

LayerNorm::LayerNorm(std::int64_t features, double epsilon) : epsilon_(epsilon) {
  if (features <= 0)
    throw InvalidArgument(fmt::format("LayerNorm needs features > 0, got {}", features));
  if (!(epsilon > 0.0))
    throw InvalidArgument(fmt::format("LayerNorm epsilon {} is not positive", epsilon));
  weight_ = {"weight",
             Tensor::full(Shape{features}, DType::f32, 1.0),
             Tensor(Shape{features}, DType::f32),
             {}};
  bias_ = {"bias", Tensor(Shape{features}, DType::f32), Tensor(Shape{features}, DType::f32), {}};
}

Tensor layer_norm_rows(const Tensor& x, const Tensor& gamma, const Tensor& beta, double epsilon,
                       Tensor* normalized, std::vector<double>* inverse_std) {
  const std::int64_t rows = x.shape()[0];
  const std::int64_t n = x.shape()[1];
  Tensor output = Tensor::uninitialized(x.shape(), DType::f32);
  if (normalized != nullptr) *normalized = Tensor::uninitialized(x.shape(), DType::f32);
  if (inverse_std != nullptr) inverse_std->assign(static_cast<std::size_t>(rows), 0.0);
  const Tensor dense = x.contiguous();
  const float* in = dense.values<float>().data();
  float* y = output.values<float>().data();
  float* xhat = normalized != nullptr ? normalized->values<float>().data() : nullptr;
  const Tensor g = gamma.contiguous();
  const Tensor b = beta.contiguous();
  const auto scale = g.values<float>();
  const auto shift = b.values<float>();
  // Rows side by side (kNormRows).
  for (std::int64_t r0 = 0; r0 < rows; r0 += kNormRows) {
    const NormRowGroup group = norm_row_group(r0, rows, n);
    const float* row[kNormRows];
    for (std::int64_t r = 0; r < kNormRows; ++r)
      row[r] = in + group.at[static_cast<std::size_t>(r)];
    double mean[kNormRows] = {};
    for (std::int64_t j = 0; j < n; ++j)
      for (std::int64_t r = 0; r < kNormRows; ++r)
        mean[r] += row[r][j];
    double variance[kNormRows] = {};
    for (std::int64_t r = 0; r < kNormRows; ++r)
      mean[r] /= static_cast<double>(n);
    for (std::int64_t j = 0; j < n; ++j) {
      for (std::int64_t r = 0; r < kNormRows; ++r) {
        const double centred = row[r][j] - mean[r];
        variance[r] += centred * centred;
      }
    }
    for (std::int64_t r = 0; r < group.count; ++r) {
      const double inverse = 1.0 / std::sqrt(variance[r] / static_cast<double>(n) + epsilon);
      if (inverse_std != nullptr) (*inverse_std)[static_cast<std::size_t>(r0 + r)] = inverse;
      const std::int64_t at = group.at[static_cast<std::size_t>(r)];
      for (std::int64_t j = 0; j < n; ++j) {
        const auto value = static_cast<float>((row[r][j] - mean[r]) * inverse);
        if (xhat != nullptr) xhat[at + j] = value;
        y[at + j] = value * scale[static_cast<std::size_t>(j)] + shift[static_cast<std::size_t>(j)];
      }
    }
  }
  return output;
}

Tensor LayerNorm::forward(const Tensor& input) {
  const ProfileScope profile(ProfileRow::norms_activations);
  const std::int64_t n = weight_.value.numel();
  check_input(input, n, describe());
  const Tensor x = input.contiguous().reshape(Shape{input.numel() / n, n});
  return layer_norm_rows(x, weight_.value, bias_.value, epsilon_, &normalized_, &inverse_std_)
      .reshape(input.shape());
}

Tensor LayerNorm::backward(const Tensor& grad_output, GradientSink& sink, bool need_input_grad) {
  const ProfileScope profile(ProfileRow::norms_activations);
  if (!normalized_.defined()) throw InvalidArgument("LayerNorm: backward without a forward");
  if (!grad_output.defined() || grad_output.dtype() != DType::f32 ||
      grad_output.numel() != normalized_.numel() ||
      grad_output.shape()[grad_output.rank() - 1] != weight_.value.numel()) {
    throw InvalidArgument(fmt::format("LayerNorm: the gradient must be f32 [..., {}] with {} rows",
                                      weight_.value.numel(), normalized_.shape()[0]));
  }
  const Tensor dy = grad_output.contiguous().reshape(normalized_.shape());
  sink.add_column_products(weight_, dy, normalized_);
  sink.add_column_sums(bias_, dy);
  Tensor grad_input;
  if (need_input_grad) {
    const std::int64_t n = weight_.value.numel();
    const std::int64_t rows = dy.shape()[0];
    grad_input = Tensor::uninitialized(dy.shape(), DType::f32);
    const auto g = dy.values<float>();
    const auto xhat = normalized_.values<float>();
    const auto gamma = weight_.value.values<float>();
    auto out = grad_input.values<float>();
    // dx = (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)) / std, in f64 per row; the rows'
    // chains side by side as in the forward.
    for (std::int64_t r0 = 0; r0 < rows; r0 += kNormRows) {
      const auto [at, count] = norm_row_group(r0, rows, n);
      double mean_g[kNormRows] = {};
      double mean_gx[kNormRows] = {};
      for (std::int64_t j = 0; j < n; ++j) {
        for (std::int64_t r = 0; r < kNormRows; ++r) {
          const double dxhat = static_cast<double>(g[at[r] + j]) * gamma[j];
          mean_g[r] += dxhat;
          mean_gx[r] += dxhat * xhat[at[r] + j];
        }
      }
      for (std::int64_t r = 0; r < count; ++r) {
        const double centre = mean_g[r] / static_cast<double>(n);
        const double slope = mean_gx[r] / static_cast<double>(n);
        const double inverse = inverse_std_[static_cast<std::size_t>(r0 + r)];
        for (std::int64_t j = 0; j < n; ++j) {
          const double dxhat = static_cast<double>(g[at[r] + j]) * gamma[j];
          out[at[r] + j] = static_cast<float>((dxhat - centre - xhat[at[r] + j] * slope) * inverse);
        }
      }
    }
    grad_input = grad_input.reshape(grad_output.shape());
  }
  normalized_ = Tensor();
  return grad_input;
}

SavedState Linear::take_saved() {
  SavedState saved;
  saved.tensors.push_back(std::exchange(input_, Tensor()));
  saved.shapes.push_back(std::exchange(input_shape_, Shape()));
  return saved;
}

void Linear::restore_saved(SavedState saved) {
  input_ = std::move(saved.tensors.at(0));
  input_shape_ = std::move(saved.shapes.at(0));
}

namespace {

/// The state of a layer that keeps one tensor, moved out of it.
SavedState take_tensor(Tensor& kept) {
  SavedState saved;
  saved.tensors.push_back(std::exchange(kept, Tensor()));
  return saved;
}

}  // namespace

SavedState ReLU::take_saved() {
  return take_tensor(input_);
}

void ReLU::restore_saved(SavedState saved) {
  input_ = std::move(saved.tensors.at(0));
}

SavedState GELU::take_saved() {
  return take_tensor(input_);
}

void GELU::restore_saved(SavedState saved) {
  input_ = std::move(saved.tensors.at(0));
}

SavedState LayerNorm::take_saved() {
  SavedState saved;
  saved.tensors.push_back(std::exchange(normalized_, Tensor()));
  saved.reals = std::exchange(inverse_std_, {});
  return saved;
}

void LayerNorm::restore_saved(SavedState saved) {
  normalized_ = std::move(saved.tensors.at(0));
  inverse_std_ = std::move(saved.reals);
}

std::string LayerNorm::describe() const {
  return fmt::format("LayerNorm({})", weight_.value.numel());
}

}  // namespace meshtensor::nn
