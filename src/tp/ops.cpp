#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>
#include <vector>

#include <fmt/format.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/dtensor/comm_debug.hpp>
#include <meshtensor/kernels/activation.hpp>
#include <meshtensor/kernels/attention.hpp>
#include <meshtensor/kernels/matmul.hpp>
#include <meshtensor/kernels/portable_math.hpp>
#include <meshtensor/mesh/layout.hpp>
#include <meshtensor/nn/layers.hpp>
#include <meshtensor/nn/loss.hpp>
#include <meshtensor/tp/ops.hpp>
#include <meshtensor/tp/tensor_parallel.hpp>

namespace meshtensor::tp {

using namespace dtensor;

namespace {

/// The inputs moved to the chosen strategy, and the strategy.
struct Placed {
  std::vector<DTensor> inputs;
  OpStrategy strategy;
  const Tensor& local(std::size_t i) const { return inputs[i].local(); }
};

using Compute = std::function<Tensor(const Placed&)>;

void check_same_mesh(const std::string& op, const std::vector<const DTensor*>& inputs) {
  for (const DTensor* x : inputs) {
    if (!(x->groups().mesh() == inputs.front()->groups().mesh())) {
      throw InvalidArgument(fmt::format("{}: inputs on meshes {} and {}", op,
                                        inputs.front()->groups().mesh().to_string(),
                                        x->groups().mesh().to_string()));
    }
  }
}

void check_dtype(const std::string& op, const DTensor& x, std::initializer_list<DType> allowed) {
  for (const DType d : allowed)
    if (x.dtype() == d) return;
  throw InvalidArgument(fmt::format("{}: {} input not supported", op, dtype_name(x.dtype())));
}

/// Sharding propagation, input moves, local compute: the op pattern every op below follows.
DTensor run_op(const std::string& op, const std::vector<const DTensor*>& inputs,
               std::vector<DimStrategy> strategies, const RedistributeOptions& options,
               const Shape& output_shape, const Compute& compute) {
  check_same_mesh(op, inputs);
  OpSchema schema{op, {}, {}, {}, std::move(strategies)};
  std::vector<std::string> given;
  for (const DTensor* x : inputs) {
    schema.shapes.push_back(x->global_shape());
    schema.specs.push_back(x->spec());
    schema.dtypes.push_back(x->dtype());
    given.push_back(x->spec().to_string());
  }
  plan::PlanOptions plan_options;
  plan_options.merge = options.merge && options.allow_flattened_groups;
  const DTensor& first = *inputs.front();
  Placed placed{{}, select_strategy(first.groups().mesh(), schema, plan_options)};
  const OpScope scope(op, given, placed.strategy);
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const PlacementSpec& target = placed.strategy.inputs[i];
    placed.inputs.push_back(inputs[i]->spec() == target ? *inputs[i]
                                                        : inputs[i]->redistribute(target, options));
  }
  Tensor local = compute(placed);
  return {first.shared_groups(), placed.strategy.output, output_shape, std::move(local)};
}

/// The block of `x` as [rows, last dim].
Tensor as_rows(const Tensor& x) {
  const Tensor dense = x.contiguous();
  const std::int64_t cols = x.rank() == 0 ? 1 : x.shape()[x.rank() - 1];
  return dense.reshape(Shape{cols == 0 ? 0 : x.numel() / cols, cols});
}

Shape with_last(const Shape& shape, std::int64_t last) {
  std::vector<std::int64_t> dims = shape.dims();
  dims.back() = last;
  return Shape(dims);
}

Tensor local_matmul(const Placed& p, MatmulForm form) {
  const Tensor& a = p.local(0);
  const Tensor& b = p.local(1);
  using kernels::Transpose;
  const DType out = a.dtype() == DType::f64 ? DType::f64 : DType::f32;
  if (form == MatmulForm::tn) {
    const Tensor a2 = as_rows(a);
    const Tensor b2 = as_rows(b);
    Tensor c = Tensor::uninitialized(Shape{a2.shape()[1], b2.shape()[1]}, out);
    kernels::matmul(a2, Transpose::yes, b2, Transpose::no, c);
    return c;
  }
  const Tensor a2 = as_rows(a);
  const Transpose tb = form == MatmulForm::nt ? Transpose::yes : Transpose::no;
  const std::int64_t n = b.shape()[form == MatmulForm::nn ? 1 : 0];
  Tensor c = Tensor::uninitialized(Shape{a2.shape()[0], n}, out);
  kernels::matmul(a2, Transpose::no, b.contiguous(), tb, c);
  return c.reshape(with_last(a.shape(), n));
}

/// y = f(x) elementwise over an f32 block.
Tensor map_f32(const Tensor& x, const std::function<void(const float*, float*, std::int64_t)>& f) {
  const Tensor dense = x.contiguous();
  Tensor y = Tensor::uninitialized(x.shape(), DType::f32);
  f(dense.values<float>().data(), y.values<float>().data(), x.numel());
  return y;
}

Tensor local_add(const Placed& p) {
  const Tensor a = p.local(0).contiguous();
  const Tensor b = p.local(1).contiguous();
  Tensor y = Tensor::uninitialized(a.shape(), DType::f32);
  const auto av = a.values<float>();
  const auto bv = b.values<float>();
  const auto yv = y.values<float>();
  const std::size_t period = bv.size();
  for (std::size_t i = 0; i < yv.size(); ++i)
    yv[i] = av[i] + bv[period == 0 ? 0 : i % period];
  return y;
}

Tensor local_layer_norm(const Placed& p, double epsilon) {
  return nn::layer_norm_rows(as_rows(p.local(0)), p.local(1), p.local(2), epsilon)
      .reshape(p.local(0).shape());
}

Tensor local_softmax(const Placed& p) {
  const Tensor x = as_rows(p.local(0));
  Tensor y = Tensor::uninitialized(x.shape(), DType::f32);
  const std::int64_t cols = x.shape()[1];
  const float* xv = x.values<float>().data();
  float* yv = y.values<float>().data();
  for (std::int64_t r = 0; r < x.shape()[0]; ++r) {
    const float* row = xv + r * cols;
    float top = -INFINITY;
    for (std::int64_t c = 0; c < cols; ++c)
      top = std::fmax(top, row[c]);
    double sum = 0;
    for (std::int64_t c = 0; c < cols; ++c)
      sum += kernels::exp_f64(static_cast<double>(row[c]) - top);
    for (std::int64_t c = 0; c < cols; ++c)
      yv[r * cols + c] =
          static_cast<float>(kernels::exp_f64(static_cast<double>(row[c]) - top) / sum);
  }
  return y.reshape(p.local(0).shape());
}

Tensor local_attention(const Placed& p) {
  const Tensor q = p.local(0).contiguous();
  const Tensor k = p.local(1).contiguous();
  const Tensor v = p.local(2).contiguous();
  const std::int64_t heads = q.shape()[0] * q.shape()[1];
  const std::int64_t length = q.shape()[2];
  const std::int64_t dim = q.shape()[3];
  Tensor out = Tensor::uninitialized(q.shape(), DType::f32);
  std::vector<float> keys_t(static_cast<std::size_t>(dim * length));
  std::vector<std::int64_t> positions(static_cast<std::size_t>(length));
  std::iota(positions.begin(), positions.end(), std::int64_t{0});
  const float scale = 1.0f / std::sqrt(static_cast<float>(dim));
  for (std::int64_t h = 0; h < heads; ++h) {
    const std::int64_t base = h * length * dim;
    const float* keys = k.values<float>().data() + base;
    for (std::int64_t j = 0; j < length; ++j)
      for (std::int64_t d = 0; d < dim; ++d)
        keys_t[static_cast<std::size_t>(d * length + j)] = keys[j * dim + d];
    const kernels::HeadCache cache{keys_t.data(), v.values<float>().data() + base, length, dim};
    kernels::attention_rows(q.values<float>().data() + base, dim, positions.data(), length, cache,
                            scale, out.values<float>().data() + base, dim);
  }
  return out;
}

Tensor local_embedding(const Placed& p, std::int64_t rows) {
  const DTensor& table = p.inputs[0];
  const Layout layout = local_layout(table.groups().mesh(), table.spec(), table.global_shape(),
                                     table.groups().rank());
  const std::int64_t first = layout.global_offset[0];
  const Tensor block = table.local().contiguous();
  const std::int64_t held = block.shape()[0];
  const std::int64_t dim = block.shape()[1];
  const Tensor ids = p.local(1).contiguous();
  std::vector<std::int64_t> dims = ids.shape().dims();
  dims.push_back(dim);
  Tensor out = Tensor::zeros(Shape(dims), DType::f32);
  const auto id_values = ids.values<std::int32_t>();
  for (std::size_t i = 0; i < id_values.size(); ++i) {
    const std::int64_t id = id_values[i];
    if (id < 0 || id >= rows)
      throw InvalidArgument(fmt::format("embedding: id {} outside the table's {} rows", id, rows));
    if (id < first || id >= first + held) continue;
    std::memcpy(out.values<float>().data() + static_cast<std::int64_t>(i) * dim,
                block.values<float>().data() + (id - first) * dim,
                static_cast<std::size_t>(dim) * sizeof(float));
  }
  return out;
}

/// The classes of a logits block sharded over `dims` of the mesh: its first class, and the
/// group over which the class sums complete.
class MeshClassSplit : public nn::ClassSplit {
 public:
  MeshClassSplit(const DTensor& logits, std::vector<int> dims, const RedistributeOptions& options)
      : first_(local_layout(logits.groups().mesh(), logits.spec(), logits.global_shape(),
                            logits.groups().rank())
                   .global_offset[1]),
        classes_(logits.global_shape()[1]),
        dims_(std::move(dims)),
        group_(logits.groups().group(dims_)),
        mesh_(logits.groups().mesh()),
        options_(options) {}
  std::int64_t first_class() const override { return first_; }
  std::int64_t classes() const override { return classes_; }
  void all_reduce(std::span<double> values, ReduceOp op) override {
    all_reduce_values(*group_, values, op, options_.mode, "cross_entropy vocabulary",
                      options_.timeout);
    record(fmt::format("vocabulary {}", reduce_op_name(op)), values.size() * sizeof(double));
  }
  void all_reduce_exact(kernels::BinnedSums& sums, std::span<double> rounded) override {
    // Merging the bins (not the per-rank rounded sums) rounds once, whatever the class split.
    all_reduce_binned_values(*group_, sums, rounded, "cross_entropy exponential sums");
    record("vocabulary exact sums", rounded.size() * sizeof(double) * 4);
  }

 private:
  void record(const std::string& purpose, std::size_t bytes) {
    CommDebugMode* mode = CommDebugMode::active();
    if (mode == nullptr) return;
    std::vector<std::string> names;
    for (const int d : dims_)
      names.push_back(mesh_.dim_name(d));
    mode->add_collective(
        {"all_reduce", names, group_->size(), static_cast<std::int64_t>(bytes), purpose});
  }

  std::int64_t first_;
  std::int64_t classes_;
  std::vector<int> dims_;
  std::shared_ptr<comm::Communicator> group_;
  DeviceMesh mesh_;
  RedistributeOptions options_;
};

Tensor local_cross_entropy(const Placed& p, const RedistributeOptions& options) {
  const DTensor& logits = p.inputs[0];
  const std::vector<int> class_dims = p.strategy.inputs[0].shard_mesh_dims(1);
  std::unique_ptr<MeshClassSplit> split;
  nn::CrossEntropyOptions ce;
  ce.exact_sums = options.mode == comm::ReductionMode::exact;
  ce.count_correct = false;
  if (!class_dims.empty()) {
    split = std::make_unique<MeshClassSplit>(logits, class_dims, options);
    ce.split = split.get();
  }
  const Tensor labels = p.local(1).contiguous();
  const auto result =
      nn::softmax_cross_entropy(logits.local().contiguous(), labels.values<std::int32_t>(), ce);
  double sum = 0;
  for (const double loss : result.losses.values<double>())
    sum += loss;
  Tensor out = Tensor::uninitialized(Shape{}, DType::f64);
  out.values<double>()[0] = sum / static_cast<double>(logits.global_shape()[0]);
  return out;
}

}  // namespace

DTensor matmul(const DTensor& a, const DTensor& b, MatmulForm form,
               const RedistributeOptions& options) {
  check_dtype("matmul", a, {DType::f32, DType::f64});
  if (a.dtype() != b.dtype()) {
    throw InvalidArgument(
        fmt::format("matmul: a is {}, b is {}", dtype_name(a.dtype()), dtype_name(b.dtype())));
  }
  const Shape out = matmul_shape(a.global_shape(), b.global_shape(), form);
  return run_op("matmul " + matmul_form_name(form), {&a, &b},
                matmul_strategies(a.global_shape(), b.global_shape(), form), options, out,
                [form](const Placed& p) { return local_matmul(p, form); });
}

DTensor add(const DTensor& a, const DTensor& b, const RedistributeOptions& options) {
  check_dtype("add", a, {DType::f32});
  check_dtype("add", b, {DType::f32});
  const auto& ad = a.global_shape().dims();
  const auto& bd = b.global_shape().dims();
  if (bd.size() > ad.size() || !std::equal(bd.rbegin(), bd.rend(), ad.rbegin())) {
    throw InvalidArgument(fmt::format("add: b {} is not a {} or a suffix of it",
                                      b.global_shape().to_string(), a.global_shape().to_string()));
  }
  return run_op("add", {&a, &b}, add_strategies(a.global_shape(), b.global_shape()), options,
                a.global_shape(), local_add);
}

DTensor scale(const DTensor& x, double factor, const RedistributeOptions& options) {
  check_dtype("scale", x, {DType::f32});
  return run_op("scale", {&x}, pointwise_strategies(x.global_shape(), true), options,
                x.global_shape(), [factor](const Placed& p) {
                  return map_f32(p.local(0), [factor](const float* in, float* out, std::int64_t n) {
                    for (std::int64_t i = 0; i < n; ++i)
                      out[i] = static_cast<float>(in[i] * factor);
                  });
                });
}

DTensor gelu(const DTensor& x, const RedistributeOptions& options) {
  check_dtype("gelu", x, {DType::f32});
  return run_op("gelu", {&x}, pointwise_strategies(x.global_shape(), false), options,
                x.global_shape(),
                [](const Placed& p) { return map_f32(p.local(0), kernels::gelu_forward); });
}

DTensor layer_norm(const DTensor& x, const DTensor& weight, const DTensor& bias, double epsilon,
                   const RedistributeOptions& options) {
  check_dtype("layer_norm", x, {DType::f32});
  const std::int64_t features = x.global_shape().rank() == 0 ? 0 : x.global_shape().dims().back();
  for (const DTensor* p : {&weight, &bias}) {
    if (!(p->global_shape() == Shape{features}) || p->dtype() != DType::f32) {
      throw InvalidArgument(fmt::format("layer_norm: weight and bias must be f32 [{}], got {} {}",
                                        features, dtype_name(p->dtype()),
                                        p->global_shape().to_string()));
    }
  }
  return run_op("layer_norm", {&x, &weight, &bias}, row_strategies(x.global_shape(), 2), options,
                x.global_shape(),
                [epsilon](const Placed& p) { return local_layer_norm(p, epsilon); });
}

DTensor softmax(const DTensor& x, const RedistributeOptions& options) {
  check_dtype("softmax", x, {DType::f32});
  return run_op("softmax", {&x}, row_strategies(x.global_shape(), 0), options, x.global_shape(),
                local_softmax);
}

DTensor attention(const DTensor& q, const DTensor& k, const DTensor& v,
                  const RedistributeOptions& options) {
  for (const DTensor* x : {&q, &k, &v}) {
    check_dtype("attention", *x, {DType::f32});
    if (x->global_shape().rank() != 4 || !(x->global_shape() == q.global_shape())) {
      throw InvalidArgument(fmt::format(
          "attention: q, k and v must share one [batch, heads, sequence, head_dim] shape, got {}",
          x->global_shape().to_string()));
    }
  }
  return run_op("attention", {&q, &k, &v}, attention_strategies(q.global_shape()), options,
                q.global_shape(), local_attention);
}

DTensor embedding(const DTensor& table, const DTensor& ids, const RedistributeOptions& options) {
  check_dtype("embedding", table, {DType::f32});
  check_dtype("embedding", ids, {DType::i32});
  if (table.global_shape().rank() != 2) {
    throw InvalidArgument(fmt::format("embedding: the table must be [rows, dim], got {}",
                                      table.global_shape().to_string()));
  }
  std::vector<std::int64_t> dims = ids.global_shape().dims();
  dims.push_back(table.global_shape()[1]);
  const std::int64_t rows = table.global_shape()[0];
  return run_op("embedding", {&table, &ids},
                embedding_strategies(table.global_shape(), ids.global_shape()), options,
                Shape(dims), [rows](const Placed& p) { return local_embedding(p, rows); });
}

DTensor cross_entropy(const DTensor& logits, const DTensor& labels,
                      const RedistributeOptions& options) {
  check_dtype("cross_entropy", logits, {DType::f32});
  check_dtype("cross_entropy", labels, {DType::i32});
  const Shape& shape = logits.global_shape();
  if (shape.rank() != 2 || !(labels.global_shape() == Shape{shape[0]})) {
    throw InvalidArgument(fmt::format(
        "cross_entropy: logits must be [rows, classes] and labels [rows], got {} and {}",
        shape.to_string(), labels.global_shape().to_string()));
  }
  return run_op("cross_entropy", {&logits, &labels}, cross_entropy_strategies(shape), options,
                Shape{}, [options](const Placed& p) { return local_cross_entropy(p, options); });
}

}  // namespace meshtensor::tp
