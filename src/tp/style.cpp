#include <set>

#include <fmt/format.h>

#include <meshtensor/core/error.hpp>
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

/// Keeps columns (dim 1) or rows (dim 0) `chunk` of `p` and records where they lie.
void keep_chunk(nn::Parameter& p, int dim, const Chunk& chunk) {
  const Shape global = p.value.shape();
  p.value = p.value.narrow(dim, chunk.offset, chunk.size).contiguous();
  p.grad = Tensor(p.value.shape(), DType::f32);
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

void ColwiseParallel::apply(nn::Module& module, const std::string& path, TensorParallel& tp) const {
  nn::Linear& linear = as_linear(module, path, "ColwiseParallel");
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
  keep_chunk(linear.bias(), 0, chunk);
  linear.set_exact_blocks(in_blocks, local);
  linear.set_split(
      &tp.keep(std::make_unique<StyleCommunication>(tp, path, false, input_, Placement::shard(2))));
}

RowwiseParallel::RowwiseParallel(Placement output) : output_(output) {}

std::string RowwiseParallel::describe() const {
  return fmt::format("RowwiseParallel(output={})", placement_text(output_));
}

void RowwiseParallel::apply(nn::Module& module, const std::string& path, TensorParallel& tp) const {
  if (auto* embedding = dynamic_cast<nn::TokenPositionEmbedding*>(&module)) {
    nn::Parameter& table = embedding->token().weight();
    const std::int64_t rows = table.value.shape()[0];
    const Chunk chunk = chunk_extent(rows, tp.size(), tp.rank());
    keep_chunk(table, 0, chunk);
    embedding->token().set_row_range(chunk.offset, rows);
    for (nn::Parameter* p : embedding->parameters())
      if (p != &table) keep_whole(*p, tp, false);
    embedding->set_split(&tp.keep(
        std::make_unique<StyleCommunication>(tp, path, true, Placement::replicate(), output_)));
    return;
  }
  nn::Linear& linear = as_linear(module, path, "RowwiseParallel");
  const std::int64_t in = linear.weight().value.shape()[0];
  const auto [in_blocks, out_blocks] = linear.exact_blocks();
  const std::int64_t local = local_blocks(in_blocks, in, tp, path);
  keep_chunk(linear.weight(), 0, chunk_extent(in, tp.size(), tp.rank()));
  keep_whole(linear.bias(), tp, false);
  linear.set_exact_blocks(local, out_blocks);
  linear.set_split(
      &tp.keep(std::make_unique<StyleCommunication>(tp, path, true, Placement::shard(2), output_)));
}

void SequenceParallel::apply(nn::Module& module, const std::string& path,
                             TensorParallel& tp) const {
  if (dynamic_cast<nn::LayerNorm*>(&module) == nullptr) {
    throw InvalidArgument(fmt::format("SequenceParallel applies to a LayerNorm; '{}' is {}", path,
                                      module.describe()));
  }
  for (nn::Parameter* p : module.parameters())
    keep_whole(*p, tp, true);
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
      if (tp.size() > 1) style->apply(*module, path, tp);
      applied.emplace_back(path, style->describe());
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

ParallelizePlan gpt_plan(bool sequence_parallel) {
  const Placement activations = sequence_parallel ? Placement::shard(1) : Placement::replicate();
  const auto colwise = std::make_shared<ColwiseParallel>(activations);
  const auto rowwise = std::make_shared<RowwiseParallel>(activations);
  ParallelizePlan plan{
      {"embed", rowwise},           {"blocks.*.attn.qkv", colwise}, {"blocks.*.attn.proj", rowwise},
      {"blocks.*.mlp.fc", colwise}, {"blocks.*.mlp.proj", rowwise}, {"head.output", colwise}};
  if (sequence_parallel) {
    const auto sequence = std::make_shared<SequenceParallel>();
    for (const char* norm : {"blocks.*.norm1", "blocks.*.norm2", "head.norm"})
      plan.emplace_back(norm, sequence);
  }
  return plan;
}

void check_gpt_degree(const nn::GptConfig& config, std::int64_t degree) {
  if (degree < 1)
    throw InvalidArgument(fmt::format("tensor-parallel degree {} is not positive", degree));
  if (config.heads % degree != 0) {
    throw InvalidArgument(fmt::format(
        "tensor-parallel degree {} does not divide the model's {} heads (each rank computes whole "
        "heads; choose a degree that divides {}, or heads=...)",
        degree, config.heads, config.heads));
  }
  if (config.vocabulary < degree) {
    throw InvalidArgument(fmt::format("tensor-parallel degree {} exceeds the vocabulary of {}",
                                      degree, config.vocabulary));
  }
}

}  // namespace meshtensor::tp
