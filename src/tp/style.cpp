#include <set>
#include <utility>

#include <fmt/format.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/dtensor/sharding.hpp>
#include <meshtensor/mesh/layout.hpp>
#include <meshtensor/nn/embedding.hpp>
#include <meshtensor/nn/layers.hpp>
#include <meshtensor/tp/style.hpp>

namespace meshtensor::tp {

namespace {

std::string placement_text(const Placement& p) {
  if (p.is_replicate()) return "Replicate";
  if (p.is_partial()) return "Partial";
  return fmt::format("Shard({})", p.shard_dim());
}

/// The communication a style installs on one module: where its input arrives, whether its
/// output holds partial sums, where the output goes.
class StyleCommunication : public nn::SplitCommunication {
 public:
  StyleCommunication(TensorParallel& tp, std::string path, bool partial_output, Placement input,
                     Placement output)
      : tp_(tp),
        path_(std::move(path)),
        partial_output_(partial_output),
        input_(input),
        output_(output) {}

  bool output_is_partial() const override { return partial_output_; }
  bool is_first() const override { return tp_.rank() == 0; }
  nn::SavedState take_saved() override {
    nn::SavedState saved;
    saved.shapes = {std::exchange(input_shape_, Shape()), std::exchange(output_shape_, Shape())};
    return saved;
  }
  void restore_saved(nn::SavedState saved) override {
    input_shape_ = std::move(saved.shapes.at(0));
    output_shape_ = std::move(saved.shapes.at(1));
  }

  Tensor gather_input(const Tensor& input) override {
    input_shape_ = input.shape();
    if (!input_.is_shard() || input_.shard_dim() != 1) return input;
    std::vector<std::int64_t> dims = input.shape().dims();
    dims.at(1) = tp_.sequence_length();
    input_shape_ = Shape(dims);
    return tp_.redistribute(input, input_shape_, input_, Placement::replicate(), path_, "forward",
                            "input Shard(1) -> Replicate");
  }

  Tensor complete_output(const nn::PartialSums& partial) override {
    if (!partial_output_) return nn::round_partial(partial);
    const Shape& shape = partial.exact != nullptr ? partial.shape : partial.values.shape();
    output_shape_ = shape;
    if (output_.is_shard()) tp_.set_sequence_length(shape[output_.shard_dim()]);
    const std::string what = "output Partial -> " + placement_text(output_);
    if (partial.exact != nullptr)
      return tp_.complete_exact(*partial.exact, shape, output_, path_, "forward", what);
    return tp_.redistribute(partial.values, shape, Placement::partial(), output_, path_, "forward",
                            what);
  }

  void skip_output(const Shape& partial_shape) override {
    if (!partial_output_) return;
    output_shape_ = partial_shape;
    if (output_.is_shard()) tp_.set_sequence_length(partial_shape[output_.shard_dim()]);
  }

  Tensor gather_output_grad(const Tensor& grad) override {
    if (!partial_output_ || !output_.is_shard()) return grad;
    return tp_.redistribute(grad, output_shape_, output_, Placement::replicate(), path_, "backward",
                            "grad output " + placement_text(output_) + " -> Replicate");
  }

  Tensor complete_input_grad(const nn::PartialSums& partial) override {
    if (partial_output_) return nn::round_partial(partial);
    const std::string what = "grad input Partial -> " + placement_text(input_);
    if (partial.exact != nullptr)
      return tp_.complete_exact(*partial.exact, partial.shape, input_, path_, "backward", what);
    return tp_.redistribute(partial.values, partial.values.shape(), Placement::partial(), input_,
                            path_, "backward", what);
  }

 private:
  TensorParallel& tp_;
  std::string path_;
  bool partial_output_;
  Placement input_;
  Placement output_;
  Shape input_shape_;
  Shape output_shape_;
};

/// A module's input (or output) moved between two layouts at its boundary, and its gradient back.
class LayoutBoundary : public nn::ModuleBoundary {
 public:
  LayoutBoundary(TensorParallel& tp, std::string path, bool at_input, Placement from, Placement to)
      : tp_(tp), path_(std::move(path)), at_input_(at_input), from_(from), to_(to) {}

  Tensor input(const Tensor& x) override { return at_input_ ? forward(x, "input") : x; }
  Tensor output(const Tensor& y) override { return at_input_ ? y : forward(y, "output"); }
  Tensor output_grad(const Tensor& dy) override {
    return at_input_ ? dy : backward(dy, "grad output");
  }
  Tensor input_grad(const Tensor& dx) override {
    return at_input_ ? backward(dx, "grad input") : dx;
  }
  nn::SavedState take_saved() override {
    nn::SavedState saved;
    saved.shapes.push_back(std::exchange(global_, Shape()));
    return saved;
  }
  void restore_saved(nn::SavedState saved) override { global_ = std::move(saved.shapes.at(0)); }

 private:
  Tensor forward(const Tensor& local, const std::string& what) {
    global_ = global_shape(local);
    if (to_.is_shard() && to_.shard_dim() == 1) tp_.set_sequence_length(global_[1]);
    if (from_ == to_) return local;
    return tp_.redistribute(local, global_, from_, to_, path_, "forward",
                            what + " " + placement_text(from_) + " -> " + placement_text(to_));
  }
  Tensor backward(const Tensor& local, const std::string& what) {
    if (from_ == to_) return local;
    return tp_.redistribute(local, global_, to_, from_, path_, "backward",
                            what + " " + placement_text(to_) + " -> " + placement_text(from_));
  }
  /// The whole shape of blocks placed by from_: a sharded dim's extents summed over the group.
  Shape global_shape(const Tensor& local) {
    if (!from_.is_shard()) return local.shape();
    const int dim = from_.shard_dim();
    if (dim >= local.rank()) {
      throw InvalidArgument(
          fmt::format("{}: {} of a {}-d activation", path_, placement_text(from_), local.rank()));
    }
    Tensor extent = Tensor::full(Shape{1}, DType::f64, static_cast<double>(local.shape()[dim]));
    comm::CollectiveOptions options;
    options.label = path_ + " sharded extent";
    tp_.group().all_reduce(extent, options);
    std::vector<std::int64_t> dims = local.shape().dims();
    dims[static_cast<std::size_t>(dim)] = static_cast<std::int64_t>(extent.values<double>()[0]);
    return Shape(dims);
  }

  TensorParallel& tp_;
  std::string path_;
  bool at_input_;
  Placement from_;
  Placement to_;
  Shape global_;
};

void check_layout(const Placement& p, const std::string& style) {
  if (p.is_partial()) {
    throw InvalidArgument(fmt::format(
        "{}: layouts are Replicate or Shard(d), not {} (a partial activation's gradient is not "
        "partial)",
        style, placement_text(p)));
  }
}

/// Keeps columns (dim 1) or rows (dim 0) `chunk` of `p` and records where they lie.
void keep_chunk(nn::Parameter& p, int dim, const Chunk& chunk) {
  const Shape global = p.value.shape();
  p.value = p.value.narrow(dim, chunk.offset, chunk.size).contiguous();
  if (p.grad.defined()) p.grad = Tensor(p.value.shape(), DType::f32);
  std::vector<std::int64_t> offset(static_cast<std::size_t>(global.rank()), 0);
  offset[static_cast<std::size_t>(dim)] = chunk.offset;
  p.split = {global, offset, true, false};
}

/// Marks `p` as held whole by every member (saved by the first).
void keep_whole(nn::Parameter& p, const TensorParallel& tp, bool partial_gradients) {
  p.split = {p.value.shape(),
             std::vector<std::int64_t>(static_cast<std::size_t>(p.value.rank()), 0), tp.rank() == 0,
             partial_gradients};
}

/// The local count of `blocks` exact-sum blocks along a dim of `size` split over `tp`.
std::int64_t local_blocks(std::int64_t blocks, std::int64_t size, const TensorParallel& tp,
                          const std::string& path) {
  if (blocks <= 0) return blocks;
  if (blocks % tp.size() != 0 || size % tp.size() != 0) {
    throw InvalidArgument(fmt::format(
        "{}: its {} features in {} exact-sum blocks do not split over tensor-parallel degree {}",
        path, size, blocks, tp.size()));
  }
  return blocks / tp.size();
}

/// Sharding propagation of an op on the group's mesh, for inputs of `shapes` under `given`.
dtensor::OpStrategy propagate(const TensorParallel& tp, const std::string& op,
                              const std::vector<Shape>& shapes, const std::vector<Placement>& given,
                              std::vector<dtensor::DimStrategy> strategies) {
  dtensor::OpSchema schema{op, shapes, {}, {}, std::move(strategies)};
  for (const Placement& p : given) {
    schema.specs.emplace_back(std::vector<Placement>{p});
    schema.dtypes.push_back(DType::f32);
  }
  return dtensor::select_strategy(tp.mesh(), schema);
}

/// The strategy of a Linear's product x [batch, sequence, in] · W [in, out], x and W placed so.
dtensor::OpStrategy linear_strategy(const TensorParallel& tp, nn::Linear& linear,
                                    const Placement& input, const Placement& weight) {
  const Shape& w = linear.weight().value.shape();
  const Shape x{1, 1, w[0]};
  return propagate(tp, "matmul", {x, w}, {input, weight},
                   dtensor::matmul_strategies(x, w, dtensor::MatmulForm::nn));
}

std::string strategy_text(const std::string& op, const dtensor::OpStrategy& strategy) {
  return op + " " + strategy.to_string();
}

nn::Linear& as_linear(nn::Module& module, const std::string& path, const std::string& style) {
  auto* linear = dynamic_cast<nn::Linear*>(&module);
  if (linear == nullptr) {
    throw InvalidArgument(
        fmt::format("{} applies to a Linear; '{}' is {}", style, path, module.describe()));
  }
  return *linear;
}

}  // namespace

ColwiseParallel::ColwiseParallel(Placement input) : input_(input) {}

std::string ColwiseParallel::describe() const {
  return fmt::format("ColwiseParallel(input={})", placement_text(input_));
}

std::string ColwiseParallel::apply(nn::Module& module, const std::string& path,
                                   TensorParallel& tp) const {
  nn::Linear& linear = as_linear(module, path, "ColwiseParallel");
  if (linear.tied_table() != nullptr) return apply_tied(linear, path, tp);
  // The input arrives gathered (Replicate); the weight is split by columns.
  const dtensor::OpStrategy strategy =
      linear_strategy(tp, linear, Placement::replicate(), Placement::shard(1));
  const std::int64_t out = linear.weight().value.shape()[1];
  const auto [in_blocks, out_blocks] = linear.exact_blocks();
  const std::int64_t local = local_blocks(out_blocks, out, tp, path);
  const Chunk chunk = chunk_extent(out, tp.size(), tp.rank());
  if (chunk.size == 0) {
    throw InvalidArgument(
        fmt::format("{}: {} output features leave tensor-parallel rank {} of {} none", path, out,
                    tp.rank(), tp.size()));
  }
  keep_chunk(linear.weight(), 1, chunk);
  if (linear.has_bias()) keep_chunk(linear.bias(), 0, chunk);
  linear.set_exact_blocks(in_blocks, local);
  linear.set_split(&tp.keep(std::make_unique<StyleCommunication>(
      tp, path, strategy.output.at(0).is_partial(), input_, strategy.output.at(0))));
  return strategy_text("matmul nn", strategy);
}

/// A Linear tied to an embedding table that RowwiseParallel split by rows (the vocabulary): the
/// table's rows are the layer's output columns, so the split is already the column split; only
/// the communication is installed.
std::string ColwiseParallel::apply_tied(nn::Linear& linear, const std::string& path,
                                        TensorParallel& tp) const {
  const nn::Parameter& table = *linear.tied_table();
  const std::int64_t out = table.split.global_shape.rank() == 2 ? table.split.global_shape[0] : 0;
  const Chunk chunk = chunk_extent(out, tp.size(), tp.rank());
  if (out == 0 || table.split.offset.at(0) != chunk.offset ||
      table.value.shape()[0] != chunk.size) {
    throw InvalidArgument(fmt::format(
        "{}: its weight is the table '{}', which must be split by rows over the group first "
        "(RowwiseParallel on the embedding, earlier in the plan)",
        path, table.name));
  }
  linear.refresh_tied_weight();
  const Shape w{table.value.shape()[1], out};
  const Shape x{1, 1, w[0]};
  const dtensor::OpStrategy strategy =
      propagate(tp, "matmul", {x, w}, {Placement::replicate(), Placement::shard(1)},
                dtensor::matmul_strategies(x, w, dtensor::MatmulForm::nn));
  const auto [in_blocks, out_blocks] = linear.exact_blocks();
  linear.set_exact_blocks(in_blocks, local_blocks(out_blocks, out, tp, path));
  linear.set_split(&tp.keep(std::make_unique<StyleCommunication>(
      tp, path, strategy.output.at(0).is_partial(), input_, strategy.output.at(0))));
  return strategy_text("matmul nn (tied)", strategy);
}

RowwiseParallel::RowwiseParallel(Placement output) : output_(output) {}

std::string RowwiseParallel::describe() const {
  return fmt::format("RowwiseParallel(output={})", placement_text(output_));
}

std::string RowwiseParallel::apply(nn::Module& module, const std::string& path,
                                   TensorParallel& tp) const {
  auto* with_positions = dynamic_cast<nn::TokenPositionEmbedding*>(&module);
  auto* embedding =
      with_positions != nullptr ? &with_positions->token() : dynamic_cast<nn::Embedding*>(&module);
  if (embedding != nullptr) {
    nn::Parameter& table = embedding->weight();
    const std::int64_t rows = table.value.shape()[0];
    const Shape ids{1, 1};
    const dtensor::OpStrategy strategy = propagate(
        tp, "embedding", {table.value.shape(), ids}, {Placement::shard(0), Placement::replicate()},
        dtensor::embedding_strategies(table.value.shape(), ids));
    const Chunk chunk = chunk_extent(rows, tp.size(), tp.rank());
    keep_chunk(table, 0, chunk);
    embedding->set_row_range(chunk.offset, rows);
    for (nn::Parameter* p : module.parameters())
      if (p != &table) keep_whole(*p, tp, false);
    auto& split = tp.keep(std::make_unique<StyleCommunication>(
        tp, path, strategy.output.at(0).is_partial(), Placement::replicate(), output_));
    if (with_positions != nullptr) {
      with_positions->set_split(&split);
    } else {
      embedding->set_split(&split);
    }
    return strategy_text("embedding", strategy);
  }
  nn::Linear& linear = as_linear(module, path, "RowwiseParallel");
  // The input arrives split by features (a column-parallel layer's output); W by rows.
  const dtensor::OpStrategy strategy =
      linear_strategy(tp, linear, Placement::shard(2), Placement::shard(0));
  const std::int64_t in = linear.weight().value.shape()[0];
  const auto [in_blocks, out_blocks] = linear.exact_blocks();
  const std::int64_t local = local_blocks(in_blocks, in, tp, path);
  keep_chunk(linear.weight(), 0, chunk_extent(in, tp.size(), tp.rank()));
  if (linear.has_bias()) keep_whole(linear.bias(), tp, false);
  linear.set_exact_blocks(local, out_blocks);
  linear.set_split(&tp.keep(std::make_unique<StyleCommunication>(
      tp, path, strategy.output.at(0).is_partial(), Placement::shard(2), output_)));
  return strategy_text("matmul nn", strategy);
}

std::string SequenceParallel::apply(nn::Module& module, const std::string& path,
                                    TensorParallel& tp) const {
  const bool layer_norm = dynamic_cast<nn::LayerNorm*>(&module) != nullptr;
  if (!layer_norm && dynamic_cast<nn::RMSNorm*>(&module) == nullptr) {
    throw InvalidArgument(fmt::format("{} applies to a LayerNorm or an RMSNorm; '{}' is {}",
                                      describe(), path, module.describe()));
  }
  // Activations [batch, sequence, dim], or [batch, sequence, heads, head_dim] for a head norm.
  const Shape x = rows_dim_ == 1 ? Shape{1, 1, 1} : Shape{1, 1, 1, 1};
  std::vector<Shape> shapes{x};
  std::vector<Placement> given{Placement::shard(rows_dim_)};
  for (nn::Parameter* p : module.parameters()) {
    keep_whole(*p, tp, true);
    shapes.emplace_back(Shape{1});
    given.push_back(Placement::replicate());
  }
  const std::string op = layer_norm ? "layer_norm" : "rms_norm";
  const auto params = static_cast<int>(shapes.size() - 1);
  return op + " " +
         propagate(tp, op, shapes, given, dtensor::row_strategies(x, params)).to_string();
}

std::string SequenceParallel::describe() const {
  return rows_dim_ == 1 ? "SequenceParallel" : "HeadParallel";
}

PrepareModuleInput::PrepareModuleInput(Placement input_layout, Placement desired_input_layout)
    : from_(input_layout), to_(desired_input_layout) {
  check_layout(from_, "PrepareModuleInput");
  check_layout(to_, "PrepareModuleInput");
}

std::string PrepareModuleInput::describe() const {
  return fmt::format("PrepareModuleInput({} -> {})", placement_text(from_), placement_text(to_));
}

std::string PrepareModuleInput::apply(nn::Module& module, const std::string& path,
                                      TensorParallel& tp) const {
  module.add_boundary(&tp.keep(std::make_unique<LayoutBoundary>(tp, path, true, from_, to_)));
  return "";
}

PrepareModuleOutput::PrepareModuleOutput(Placement output_layout, Placement desired_output_layout)
    : from_(output_layout), to_(desired_output_layout) {
  check_layout(from_, "PrepareModuleOutput");
  check_layout(to_, "PrepareModuleOutput");
}

std::string PrepareModuleOutput::describe() const {
  return fmt::format("PrepareModuleOutput({} -> {})", placement_text(from_), placement_text(to_));
}

std::string PrepareModuleOutput::apply(nn::Module& module, const std::string& path,
                                       TensorParallel& tp) const {
  module.add_boundary(&tp.keep(std::make_unique<LayoutBoundary>(tp, path, false, from_, to_)));
  return "";
}

bool matches_pattern(const std::string& pattern, const std::string& path) {
  std::size_t p = 0;
  std::size_t s = 0;
  std::size_t star = std::string::npos;
  std::size_t resume = 0;
  while (s < path.size()) {
    if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      resume = s;
    } else if (p < pattern.size() && pattern[p] == path[s]) {
      ++p;
      ++s;
    } else if (star != std::string::npos && path[resume] != '.') {
      p = star + 1;
      s = ++resume;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*')
    ++p;
  return p == pattern.size();
}

std::vector<std::pair<std::string, std::string>> parallelize_module(nn::Module& root,
                                                                    TensorParallel& tp,
                                                                    const ParallelizePlan& plan) {
  const auto modules = nn::named_modules(root);
  std::vector<std::pair<std::string, std::string>> applied;
  for (const auto& [pattern, style] : plan) {
    bool matched = false;
    for (const auto& [path, module] : modules) {
      if (path.empty() || !matches_pattern(pattern, path)) continue;
      matched = true;
      const std::string strategy = tp.size() > 1 ? style->apply(*module, path, tp) : "";
      applied.emplace_back(
          path, strategy.empty() ? style->describe() : style->describe() + ": " + strategy);
    }
    if (!matched) {
      throw InvalidArgument(
          fmt::format("parallelize plan: '{}' matches no module of {}", pattern, root.describe()));
    }
  }
  if (tp.size() > 1) {
    for (nn::Parameter* p : root.parameters())
      if (p->split.global_shape.rank() == 0) keep_whole(*p, tp, false);
  }
  return applied;
}

namespace {

/// Megatron's plan for a decoder whose blocks have the two projections `mlp_in` (column-parallel)
/// and `mlp_out` (row-parallel): the rest is the same for every family.
ParallelizePlan megatron_plan(bool sequence_parallel, const std::string& mlp_in,
                              const std::string& mlp_out) {
  const Placement activations = sequence_parallel ? Placement::shard(1) : Placement::replicate();
  const auto colwise = std::make_shared<ColwiseParallel>(activations);
  const auto rowwise = std::make_shared<RowwiseParallel>(activations);
  ParallelizePlan plan{{"embed", rowwise},
                       {"blocks.*.attn.qkv", colwise},
                       {"blocks.*.attn.proj", rowwise},
                       {"blocks.*." + mlp_in, colwise},
                       {"blocks.*." + mlp_out, rowwise},
                       {"head.output", colwise}};
  if (sequence_parallel) {
    const auto sequence = std::make_shared<SequenceParallel>();
    for (const char* norm : {"blocks.*.norm1", "blocks.*.norm2", "head.norm"})
      plan.emplace_back(norm, sequence);
  }
  return plan;
}

}  // namespace

ParallelizePlan decoder_plan(const nn::DecoderSpec& spec, bool sequence_parallel) {
  const auto [mlp_in, mlp_out] = nn::mlp_projection_names(spec);
  ParallelizePlan plan = megatron_plan(sequence_parallel, mlp_in, mlp_out);
  if (spec.qk_norm) {
    const auto heads = std::make_shared<SequenceParallel>(2);
    plan.emplace_back("blocks.*.attn.q_norm", heads);
    plan.emplace_back("blocks.*.attn.k_norm", heads);
  }
  return plan;
}

void check_decoder_degree(const nn::DecoderSpec& spec, std::int64_t degree) {
  if (degree < 1)
    throw InvalidArgument(fmt::format("tensor-parallel degree {} is not positive", degree));
  if (spec.kv_heads % degree != 0 && spec.kv_heads == spec.heads) {
    throw InvalidArgument(fmt::format(
        "tensor-parallel degree {} does not divide the model's {} heads (each rank computes whole "
        "heads; choose a degree that divides {}, or heads=...)",
        degree, spec.heads, spec.heads));
  }
  if (spec.kv_heads % degree != 0) {
    throw InvalidArgument(fmt::format(
        "tensor-parallel degree {} does not divide the model's {} key/value heads (each rank "
        "computes whole groups of query heads with their key/value head; key/value heads are not "
        "replicated: choose a degree that divides {}, or kv_heads=...)",
        degree, spec.kv_heads, spec.kv_heads));
  }
  if (nn::decoder_mlp_blocks(spec) % degree != 0) {
    throw InvalidArgument(fmt::format(
        "tensor-parallel degree {} does not divide the model's {} MLP blocks (gcd of ffn {} and "
        "the {} heads: each rank computes whole blocks of the MLP's columns)",
        degree, nn::decoder_mlp_blocks(spec), spec.ffn, spec.heads));
  }
  if (spec.vocabulary < degree) {
    throw InvalidArgument(fmt::format("tensor-parallel degree {} exceeds the vocabulary of {}",
                                      degree, spec.vocabulary));
  }
}

}  // namespace meshtensor::tp
