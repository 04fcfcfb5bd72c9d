#pragma once

#include <cstdint>
#include <functional>

#include <meshtensor/kernels/matmul.hpp>
#include <meshtensor/nn/module.hpp>

namespace meshtensor::nn {

/// A matmul Linear's ordered forward may use instead of the batch-invariant kernel: y += x·W
/// (x f32 [rows, in], W f32 [in, out], y f32 [rows, out] holding the bias rows), contiguous.
using MatmulOverride = std::function<void(const Tensor& x, const Tensor& w, Tensor& y)>;

/// While one lives on a thread, Linear's ordered forward on that thread is batch-variant: it
/// calls `matmul` when given (e.g. a BLAS sgemm, whose blocking depends on the shapes: the fast
/// path batch-invariant kernels give up), else splits its sum over the input features in two
/// halves whenever a call has more than one row (a reduction that depends on the batch). For
/// negative controls and for timing what invariance costs. Scopes nest; the innermost applies.
class BatchVariantScope {
 public:
  explicit BatchVariantScope(MatmulOverride matmul = {});
  ~BatchVariantScope();
  BatchVariantScope(const BatchVariantScope&) = delete;
  BatchVariantScope& operator=(const BatchVariantScope&) = delete;
  /// The innermost scope on this thread, or null.
  static const BatchVariantScope* active();
  /// Its matmul (empty: the split halves).
  const MatmulOverride& matmul() const { return matmul_; }

 private:
  MatmulOverride matmul_;
  const BatchVariantScope* outer_;
};

/// Adds `b` into `a` elementwise (f32 tensors of one shape, contiguous): a residual connection.
void add_into(Tensor& a, const Tensor& b);

/// InvalidArgument naming `module` unless `input` is f32 [..., rows, features].
void check_input(const Tensor& input, std::int64_t features, const std::string& module);

/// y = x·W + b with W [in, out] and b [out], over the last dim of x ([..., in] -> [..., out]).
/// W starts as normal samples scaled by `init_std`, or by sqrt(2 / in) when it is 0 (He
/// initialisation); seeded and platform-independent. b starts as zeros; without `bias` there is
/// none (y = x·W, the Llama family's projections).
class Linear : public Module {
 public:
  /// `seed` makes the initial weights; the same seed gives the same bits everywhere.
  Linear(std::int64_t in_features, std::int64_t out_features, std::uint64_t seed,
         double init_std = 0.0, bool bias = true);
  Tensor forward(const Tensor& input) override;
  Tensor backward(const Tensor& grad_output, GradientSink& sink, bool need_input_grad) override;
  /// Keeps the input (backward needs nothing else) without the product or its communication.
  void forward_for_backward(const Tensor& input) override;
  /// The weight, and the bias when the layer has one.
  std::vector<Parameter*> parameters() override;
  std::string describe() const override;
  SavedState take_saved() override;
  void restore_saved(SavedState saved) override;
  SplitCommunication* split_communication() const override { return split_; }
  /// False for a layer built without a bias.
  bool has_bias() const { return has_bias_; }
  /// The weight parameter ([in, out]).
  Parameter& weight() { return weight_; }
  /// The weight parameter ([in, out]).
  const Parameter& weight() const { return weight_; }
  /// The bias parameter ([out]); undefined values without a bias (has_bias()).
  Parameter& bias() { return bias_; }

  /// Exact sums over blocks (exact mode's tensor-parallel invariance): with `in_blocks` > 0 the
  /// output is the correctly rounded sum of the bias and the f32 products of `in_blocks` equal
  /// column blocks of the input with the matching row blocks of W; with `out_blocks` > 0 the
  /// input gradient is the correctly rounded sum of the f32 products of `out_blocks` column
  /// blocks of the output gradient with those of W; kEveryColumn makes each column a block (the
  /// exact sum of the products). Blocks are fixed by the model, not by how many ranks hold them,
  /// so a split along whole blocks gives the same bits. 0: one ordered f32 product (the default).
  void set_exact_blocks(std::int64_t in_blocks, std::int64_t out_blocks);
  /// Input blocks, output blocks (see set_exact_blocks).
  std::pair<std::int64_t, std::int64_t> exact_blocks() const { return {in_blocks_, out_blocks_}; }
  /// The dtype the layer's products multiply in: f32 (the default), or bf16, where the input,
  /// the weight and the output gradient are rounded to bf16 (to nearest, ties to even) and each
  /// product accumulates in f32 as kernels::matmul defines for bf16 inputs. The bias, the
  /// output, the gradients and everything outside the products stay f32. InvalidArgument for
  /// another dtype.
  void set_compute_dtype(DType dtype);
  /// f32 or bf16 (set_compute_dtype).
  DType compute_dtype() const { return compute_dtype_; }
  /// Installs the communication of a parallel style (null: none); it must outlive the layer.
  void set_split(SplitCommunication* split) { split_ = split; }
  /// The installed communication, or null.
  SplitCommunication* split() const { return split_; }

  /// Blocks of one column each (set_exact_blocks).
  static constexpr std::int64_t kEveryColumn = -1;
  /// Ties the weight to `table` ([out, in], an embedding table, which must outlive the layer):
  /// from now on W is tableᵀ, which the products read in place (no copy is made: the bits are
  /// those of a copy, every element being one chain over k either way), and W's gradient goes
  /// to `table`; the layer has no parameter of its own. InvalidArgument for a layer with a bias
  /// or a table of another shape.
  void tie_weight_to(Parameter& table);
  /// The table the weight is tied to, or null.
  Parameter* tied_table() const { return tied_; }
  /// For a tied layer: W's shape again from the table's current local rows (a tensor-parallel
  /// split of the table changes them); every forward does it.
  void refresh_tied_weight();

 private:
  bool adds_bias() const;  // false on the other members when the output holds partial sums
  void fill_bias_rows(Tensor& output) const;  // every row of [rows, out] = the bias
  Tensor product() const;                     // bias + input·W, [rows, out]
  Tensor variant_product(const BatchVariantScope& variant) const;  // the same, batch-variant
  /// Exact blocks: the addends of each output element's exact sum, [rows, out] each (the f32
  /// products of the input's column blocks with W's row blocks, then the bias rows).
  std::vector<Tensor> forward_addends() const;
  /// Exact blocks: the output's exact sums, rounded here without a split (the verified fast
  /// path), else left in `sums` for the split to complete.
  PartialSums forward_sums(kernels::BinnedSums& sums) const;
  /// Checks the input and keeps it for backward, as [rows, in].
  void keep_input(const Tensor& input);
  /// Exact blocks: the input gradient's addends, [rows, in] each (f32 products of dy's column
  /// blocks with W's column blocks); not for kEveryColumn.
  std::vector<Tensor> input_grad_addends(const Tensor& dy) const;
  /// Exact blocks: the input gradient's exact sums, rounded here without a split, else left in
  /// `sums` for the split to complete.
  PartialSums input_grad_sums(const Tensor& dy, kernels::BinnedSums& sums) const;
  /// W as a matmul operand: the weight as stored, or a tied layer's table read transposed.
  struct WeightOperand {
    Tensor matrix;
    kernels::Transpose transpose;
  };
  WeightOperand weight_operand() const;
  WeightOperand weight_rows(std::int64_t first, std::int64_t count) const;     // W[first:+count, :]
  WeightOperand weight_columns(std::int64_t first, std::int64_t count) const;  // W[:, first:+count]
  Shape weight_shape() const;                                                  // [in, out]

  bool has_bias_ = true;
  Parameter weight_;  // a tied layer: none (the table is read in place)
  Parameter* tied_ = nullptr;
  Shape tied_shape_;  // a tied layer's W shape [in, out], kept while the table is not gathered
  Parameter bias_;
  /// `t` in the compute dtype (itself for f32).
  Tensor in_compute_dtype(const Tensor& t) const;

  Tensor input_;  // [rows, in], in the compute dtype
  Shape input_shape_;
  DType compute_dtype_ = DType::f32;
  std::int64_t in_blocks_ = 0;
  std::int64_t out_blocks_ = 0;
  SplitCommunication* split_ = nullptr;
};

/// Sets the compute dtype of every Linear in `root`'s tree (Linear::set_compute_dtype).
void set_compute_dtype(Module& root, DType dtype);

/// max(x, 0); NaN stays NaN.
class ReLU : public Module {
 public:
  Tensor forward(const Tensor& input) override;
  Tensor backward(const Tensor& grad_output, GradientSink& sink, bool need_input_grad) override;
  std::string describe() const override { return "ReLU"; }
  SavedState take_saved() override;
  void restore_saved(SavedState saved) override;

 private:
  Tensor input_;
};

/// GELU, tanh form: 0.5·x·(1 + tanh(sqrt(2/π)·(x + 0.044715·x³))), in f32 (kernels::gelu_forward).
class GELU : public Module {
 public:
  Tensor forward(const Tensor& input) override;
  Tensor backward(const Tensor& grad_output, GradientSink& sink, bool need_input_grad) override;
  std::string describe() const override { return "GELU"; }
  SavedState take_saved() override;
  void restore_saved(SavedState saved) override;

 private:
  Tensor input_;
};

/// SwiGLU's gate over features laid out in blocks of `block_width` gate columns followed by as
/// many up columns ([..., 2·n] -> [..., n]): y = SiLU(gate)·up (kernels::swiglu_forward). The
/// blocks are fixed by the model, so a column-parallel split of the layer before it along whole
/// blocks leaves every rank pairs of its own.
class SwiGLU : public Module {
 public:
  explicit SwiGLU(std::int64_t block_width);
  Tensor forward(const Tensor& input) override;
  Tensor backward(const Tensor& grad_output, GradientSink& sink, bool need_input_grad) override;
  std::string describe() const override;
  SavedState take_saved() override;
  void restore_saved(SavedState saved) override;

 private:
  std::int64_t block_width_;
  Tensor input_;  // f32 [rows, 2·n]
  Shape input_shape_;
};

/// Layer normalisation of each row of `x` (f32 [rows, n]): (x - mean) / sqrt(variance + epsilon),
/// the row statistics in f64 in a fixed order, then · gamma + beta (f32 [n] each). Also writes x̂
/// into `normalized` ([rows, n]) and each row's inverse standard deviation into `inverse_std`
/// when given (what backward needs).
Tensor layer_norm_rows(const Tensor& x, const Tensor& gamma, const Tensor& beta, double epsilon,
                       Tensor* normalized = nullptr, std::vector<double>* inverse_std = nullptr);

/// Per-row normalisation over the features (the last dim), then a learned scale (weight, ones) and
/// shift (bias, zeros). Row statistics are computed in f64 in a fixed order.
class LayerNorm : public Module {
 public:
  explicit LayerNorm(std::int64_t features, double epsilon = 1e-5);
  Tensor forward(const Tensor& input) override;
  Tensor backward(const Tensor& grad_output, GradientSink& sink, bool need_input_grad) override;
  std::vector<Parameter*> parameters() override { return {&weight_, &bias_}; }
  std::string describe() const override;
  SavedState take_saved() override;
  void restore_saved(SavedState saved) override;

 private:
  Parameter weight_;
  Parameter bias_;
  double epsilon_;
  Tensor normalized_;                // x̂, f32 [rows, features]
  std::vector<double> inverse_std_;  // per row
};

/// RMS normalisation of each row of `x` (f32 [rows, n]): x / sqrt(mean(x²) + epsilon), the mean
/// of squares in f64 in a fixed order and each normalised value rounded once to f32, then ·
/// gamma (f32 [n]). Also writes the normalised values into `normalized` ([rows, n]) and each
/// row's 1 / rms into `inverse_rms` when given (what backward needs).
Tensor rms_norm_rows(const Tensor& x, const Tensor& gamma, double epsilon,
                     Tensor* normalized = nullptr, std::vector<double>* inverse_rms = nullptr);

/// RMSNorm (Llama's): per-row RMS normalisation over the features (the last dim) and a learned
/// scale (weight, ones); no mean, no shift. Row statistics in f64 in a fixed order.
class RMSNorm : public Module {
 public:
  explicit RMSNorm(std::int64_t features, double epsilon = 1e-5);
  Tensor forward(const Tensor& input) override;
  Tensor backward(const Tensor& grad_output, GradientSink& sink, bool need_input_grad) override;
  std::vector<Parameter*> parameters() override { return {&weight_}; }
  std::string describe() const override;
  SavedState take_saved() override;
  void restore_saved(SavedState saved) override;

 private:
  Parameter weight_;
  double epsilon_;
  Tensor normalized_;                // x / rms, f32 [rows, features]
  std::vector<double> inverse_rms_;  // per row
};

}  // namespace meshtensor::nn
