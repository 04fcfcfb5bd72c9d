#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <meshtensor/core/tensor.hpp>
#include <meshtensor/kernels/binned_sum.hpp>

namespace meshtensor::nn {

/// Where a parameter's value lies in the whole tensor once a parallel style split it over ranks
/// (tensor parallelism); a default split means the value is the whole tensor.
struct ParameterSplit {
  Shape global_shape;                ///< the whole tensor's shape (rank 0: not split)
  std::vector<std::int64_t> offset;  ///< first element of the value in it
  /// False on the ranks holding a copy that another rank of the split group also holds (a
  /// replicated parameter): one rank saves each block.
  bool saves = true;
  /// True when the ranks of the split group see different rows of the data for this replicated
  /// parameter (sequence parallelism), so its gradient sums are partial over the group.
  bool partial_gradients = false;
};

/// A trainable tensor: its value and the gradient the last step wrote for it (same shape, f32).
struct Parameter {
  std::string name;  ///< dotted path, e.g. "layers.0.weight"
  Tensor value;
  Tensor grad;
  ParameterSplit split;  ///< set by a parallel style
  /// The whole tensor's shape (value's shape unless split).
  Shape global_shape() const {
    return split.global_shape.rank() > 0 ? split.global_shape : value.shape();
  }
};

/// While one is alive on a thread, the layers built on it leave their weights uninitialized: a
/// model whose weights are about to be read (a checkpoint, a folder, another model's values)
/// skips drawing what it would overwrite. Without `gradients` they allocate no gradients either
/// (generation, export: a model that never trains).
class WeightsToBeLoaded {
 public:
  explicit WeightsToBeLoaded(bool gradients = false);
  ~WeightsToBeLoaded();
  WeightsToBeLoaded(const WeightsToBeLoaded&) = delete;
  WeightsToBeLoaded& operator=(const WeightsToBeLoaded&) = delete;
  /// True while one is alive on this thread.
  static bool active();
  /// Whether the innermost one allocates gradients.
  static bool gradients();

 private:
  bool outer_;
  bool outer_gradients_;
};

/// Receives the sums over samples that make parameter gradients. Modules never add gradients
/// into parameters themselves: they report per-sample factors, and the sink decides how the sums
/// are formed (a fixed-order f32 sum, or an exact binned sum that any split of the batch over
/// micro-batches and ranks reproduces bit for bit). Every sum is over the rows of its inputs.
class GradientSink {
 public:
  virtual ~GradientSink() = default;
  /// grad(p) += xᵀ·dy, p of shape [x columns, dy columns] (f32 inputs).
  virtual void add_outer_products(const Parameter& p, const Tensor& x, const Tensor& dy) = 0;
  /// The same sum, its rows in samples of `sample_rows` consecutive rows each (a sequence's
  /// positions): a sink may sum each sample's products first, in a fixed order, and add the
  /// per-sample gradients. A sample is never split over ranks or micro-batches, so its order is
  /// the same on every layout. By default: add_outer_products.
  virtual void add_sample_outer_products(const Parameter& p, const Tensor& x, const Tensor& dy,
                                         std::int64_t sample_rows) {
    (void)sample_rows;
    add_outer_products(p, x, dy);
  }
  /// grad(p)[j] += sum over rows of a[r][j] (f32).
  virtual void add_column_sums(const Parameter& p, const Tensor& a) = 0;
  /// grad(p)[j] += sum over rows of a[r][j] * b[r][j] (f32).
  virtual void add_column_products(const Parameter& p, const Tensor& a, const Tensor& b) = 0;
  /// grad(p)[indices[r]][j] += rows[r][j] for every row r, p of shape [count, rows' columns]
  /// (f32 rows, each index below count): the gradient of an embedding table, where one index
  /// may appear in many rows.
  virtual void add_indexed_rows(const Parameter& p, std::span<const std::int64_t> indices,
                                const Tensor& rows) = 0;
};

class Module;

/// What a module's forward keeps for its backward (inputs, normalised values, shapes), moved out
/// of it: a pipeline stage keeps one per micro-batch in flight, activation checkpointing drops it
/// and runs the forward again. The owner alone knows what each entry means.
struct SavedState {
  std::vector<Tensor> tensors;
  std::vector<Shape> shapes;
  std::vector<double> reals;
  std::vector<std::int64_t> integers;
  /// True when nothing was kept.
  bool empty() const {
    return tensors.empty() && shapes.empty() && reals.empty() && integers.empty();
  }
};

/// A module's partial result: sums over a dimension that is split over ranks (or over blocks of
/// it), not yet complete. `values` holds f32 partial sums (ordered and native modes); in exact
/// mode `exact` points at binned sums of `shape`'s elements instead.
struct PartialSums {
  Tensor values;
  kernels::BinnedSums* exact = nullptr;
  Shape shape;
};

/// The communication a parallel style installs on a module whose work is split over the ranks of
/// a group (tensor parallelism): the module computes its local part and calls these where its
/// input rows or sums are incomplete. Every member of the group makes the same calls.
class SplitCommunication {
 public:
  virtual ~SplitCommunication() = default;
  /// True when the module's output holds partial sums (the dim it sums over is split): terms
  /// every member holds (a bias) are added by the first member only.
  virtual bool output_is_partial() const = 0;
  /// True on the group's first member.
  virtual bool is_first() const = 0;
  /// Forward: the input as the local computation needs it (rows gathered from the members'
  /// sequence shards, or the input itself).
  virtual Tensor gather_input(const Tensor& input) = 0;
  /// Forward: the output from the module's partial or local result (sums completed over the
  /// group, rows scattered to this member's shard; rounded once in exact mode).
  virtual Tensor complete_output(const PartialSums& partial) = 0;
  /// Forward without its output: keeps what complete_output would keep for backward, for an
  /// output of `partial_shape`, and moves nothing.
  virtual void skip_output(const Shape& partial_shape) { (void)partial_shape; }
  /// Backward of complete_output: the output gradient as the local computation needs it.
  virtual Tensor gather_output_grad(const Tensor& grad) = 0;
  /// Backward of gather_input: the input gradient from the module's partial or local result.
  virtual Tensor complete_input_grad(const PartialSums& partial) = 0;
  /// Moves out what forward kept for backward (shapes); restore_saved puts it back.
  virtual SavedState take_saved() { return {}; }
  /// Puts back what take_saved moved out.
  virtual void restore_saved(SavedState saved) { (void)saved; }
};

/// How a sequence is split over the ranks of a context-parallel group: the positions of the whole
/// sequence this rank's rows are, and the collective that brings every member's rows together
/// in position order. Attention uses it to see every key; the embeddings and rotary tables to
/// use the rows' own positions. Every member makes the same calls.
class SequenceSplit {
 public:
  virtual ~SequenceSplit() = default;
  /// Ranks in the group.
  virtual int degree() const = 0;
  /// This rank's position in the group.
  virtual int rank() const = 0;
  /// Positions of the whole sequence of the current forward or backward.
  virtual std::int64_t length() const = 0;
  /// The positions of this rank's rows in the whole sequence, ascending.
  virtual const std::vector<std::int64_t>& positions() const = 0;
  /// The pieces of positions(): first position and count of each run of consecutive ones.
  virtual std::vector<std::pair<std::int64_t, std::int64_t>> pieces() const = 0;
  /// Every member's f32 rows [batch, its positions, width] as [batch, length(), width], row t
  /// holding position t. Collective.
  virtual Tensor gather(const Tensor& local) = 0;
};

/// The positions `split` gives each of `batch` sequences' rows, in row order; with no split,
/// 0 .. length-1 for each.
std::vector<std::int64_t> row_positions(const SequenceSplit* split, std::int64_t batch,
                                        std::int64_t length);

/// The whole result of `partial` on one rank: its values, or its binned sums rounded once.
Tensor round_partial(const PartialSums& partial);

/// Runs around a module's forward and backward when installed on it (Module::set_hooks), for
/// whatever calls the module through run_forward() / run_backward(): a sharded-parameter runtime
/// gathers the module's parameters before and frees them after.
class ModuleHooks {
 public:
  virtual ~ModuleHooks() = default;
  /// Before forward.
  virtual void pre_forward(Module& module) = 0;
  /// After forward.
  virtual void post_forward(Module& module) = 0;
  /// Before backward.
  virtual void pre_backward(Module& module) = 0;
  /// After backward (every gradient of the module reported to the sink).
  virtual void post_backward(Module& module) = 0;
};

/// Moves activations at a module's boundary when installed on it (Module::add_boundary), for
/// whatever calls the module through run_forward() / run_backward(): a parallel style that
/// changes where the module's input or output lives (PrepareModuleInput/Output).
class ModuleBoundary {
 public:
  virtual ~ModuleBoundary() = default;
  /// The input the module sees, from the input it is given.
  virtual Tensor input(const Tensor& x) = 0;
  /// The output the caller sees, from the module's output.
  virtual Tensor output(const Tensor& y) = 0;
  /// The output gradient the module sees, from the caller's.
  virtual Tensor output_grad(const Tensor& dy) = 0;
  /// The input gradient the caller sees, from the module's.
  virtual Tensor input_grad(const Tensor& dx) = 0;
  /// Moves out what input() / output() kept for the gradients; restore_saved puts it back.
  virtual SavedState take_saved() { return {}; }
  /// Puts back what take_saved moved out.
  virtual void restore_saved(SavedState saved) { (void)saved; }
};

/// A layer with explicit forward and backward. forward keeps what backward needs (its input,
/// normalised values, ...); backward consumes it. Activations are f32 [..., features] (2-D
/// [rows, features] for an MLP, [batch, sequence, features] for a transformer; token ids are
/// i64); every kernel works row by row, sequence by sequence or is a batch-invariant matmul, so a
/// row's output bits never depend on the other rows or sequences of the batch.
class Module {
 public:
  virtual ~Module() = default;
  /// The output for `input`, keeping what backward needs.
  virtual Tensor forward(const Tensor& input) = 0;
  /// Reports parameter gradient sums for `grad_output` to `sink` and returns the gradient of
  /// the last forward's input (undefined when `need_input_grad` is false).
  virtual Tensor backward(const Tensor& grad_output, GradientSink& sink, bool need_input_grad) = 0;
  /// Keeps what backward needs for `input`, as forward does, but may leave out what only the
  /// output needs (activation checkpointing's recompute: the output is not used). The default
  /// runs forward; the same bits either way.
  virtual void forward_for_backward(const Tensor& input) { (void)forward(input); }
  /// The module's parameters (pointers stay valid for the module's life).
  virtual std::vector<Parameter*> parameters() { return {}; }
  /// Short description, e.g. "Linear(784, 1024)".
  virtual std::string describe() const = 0;
  /// The modules inside this one with their names ("attn", "blocks.0"), in forward order.
  virtual std::vector<std::pair<std::string, Module*>> children() { return {}; }
  /// Installs hooks run around this module's forward and backward (null: none). The hooks must
  /// outlive the module or be removed first.
  void set_hooks(ModuleHooks* hooks) { hooks_ = hooks; }
  /// The installed hooks, or null.
  ModuleHooks* hooks() const { return hooks_; }
  /// Adds a boundary (it must outlive the module); forward applies boundaries in the order added,
  /// backward in the reverse order.
  void add_boundary(ModuleBoundary* boundary) { boundaries_.push_back(boundary); }
  /// The installed boundaries.
  const std::vector<ModuleBoundary*>& boundaries() const { return boundaries_; }
  /// Moves out what this module's own forward kept for its backward (not its children's), so
  /// that another forward can run before this one's backward; restore_saved puts it back.
  virtual SavedState take_saved() { return {}; }
  /// Puts back what take_saved moved out (the next backward uses it).
  virtual void restore_saved(SavedState saved) { (void)saved; }
  /// The tensor-parallel communication installed on this module (null: none).
  virtual SplitCommunication* split_communication() const { return nullptr; }

 private:
  ModuleHooks* hooks_ = nullptr;
  std::vector<ModuleBoundary*> boundaries_;
};

/// module.forward(input) between the module's hooks and inside its boundaries, if any.
/// Containers call their children through it.
Tensor run_forward(Module& module, const Tensor& input);

/// module.forward_for_backward(input) between the module's hooks and inside its boundaries;
/// run_forward (its output dropped) when the module has boundaries, whose output side may keep
/// state for backward.
void run_forward_for_backward(Module& module, const Tensor& input);

/// module.backward(...) between the module's hooks and inside its boundaries, if any.
Tensor run_backward(Module& module, const Tensor& grad_output, GradientSink& sink,
                    bool need_input_grad);

/// Modules applied in order.
class Sequential : public Module {
 public:
  /// Appends a module; its parameters are renamed "<index>.<name>".
  void add(std::unique_ptr<Module> module);
  /// Number of modules.
  std::size_t size() const { return modules_.size(); }
  /// Module i.
  Module& at(std::size_t i) { return *modules_.at(i); }

  Tensor forward(const Tensor& input) override;
  Tensor backward(const Tensor& grad_output, GradientSink& sink, bool need_input_grad) override;
  std::vector<Parameter*> parameters() override;
  std::string describe() const override;
  /// The modules named by their index ("0", "1", ...).
  std::vector<std::pair<std::string, Module*>> children() override;

 private:
  std::vector<std::unique_ptr<Module>> modules_;
};

/// Everything the forwards under a module kept for their backwards (every module's own state,
/// its boundaries' and its tensor-parallel communication's), moved out of the modules: what a
/// pipeline stage holds for each micro-batch in flight.
class ActivationStash {
 public:
  /// Moves the kept state of `root` and every module under it into a stash; the modules are left
  /// as before any forward.
  static ActivationStash take(Module& root);
  /// Puts the state back into the modules it came from (the same tree); the stash is empty after.
  void restore(Module& root);
  /// Bytes of the tensors held (each storage counted once).
  std::int64_t bytes() const;
  /// True when nothing is held.
  bool empty() const;

 private:
  std::vector<SavedState> states_;
};

/// Bytes of the tensors the forwards under `root` kept for their backwards (each storage once).
std::int64_t kept_bytes(Module& root);

/// Prepends "<prefix>." to the names of `module`'s parameters (a container naming its children).
void prefix_parameter_names(Module& module, const std::string& prefix);

/// The parameters of `modules`, in order: what a module made of sub-modules returns from
/// parameters().
std::vector<Parameter*> parameters_of(std::initializer_list<Module*> modules);

/// Every module under `root` with its dotted path ("blocks.0.attn.qkv"), `root` first (path
/// ""), parents before children.
std::vector<std::pair<std::string, Module*>> named_modules(Module& root);

/// Digest of the names, shapes and value bits of `parameters` in order: equal digests mean
/// bitwise-equal weights.
std::uint64_t parameters_digest(const std::vector<Parameter*>& parameters);

/// Number of scalar values in `parameters`.
std::int64_t parameter_count(const std::vector<Parameter*>& parameters);

}  // namespace meshtensor::nn
