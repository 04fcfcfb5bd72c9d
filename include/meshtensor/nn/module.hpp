#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <meshtensor/core/tensor.hpp>

namespace meshtensor::nn {

/// A trainable tensor: its value and the gradient the last step wrote for it (same shape, f32).
struct Parameter {
  std::string name;  ///< dotted path, e.g. "layers.0.weight"
  Tensor value;
  Tensor grad;
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
  /// The module's parameters (pointers stay valid for the module's life).
  virtual std::vector<Parameter*> parameters() { return {}; }
  /// Short description, e.g. "Linear(784, 1024)".
  virtual std::string describe() const = 0;
  /// Installs hooks run around this module's forward and backward (null: none). The hooks must
  /// outlive the module or be removed first.
  void set_hooks(ModuleHooks* hooks) { hooks_ = hooks; }
  /// The installed hooks, or null.
  ModuleHooks* hooks() const { return hooks_; }

 private:
  ModuleHooks* hooks_ = nullptr;
};

/// module.forward(input) between the module's hooks, if any. Containers call their children
/// through it.
Tensor run_forward(Module& module, const Tensor& input);

/// module.backward(...) between the module's hooks, if any.
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

 private:
  std::vector<std::unique_ptr<Module>> modules_;
};

/// Prepends "<prefix>." to the names of `module`'s parameters (a container naming its children).
void prefix_parameter_names(Module& module, const std::string& prefix);

/// Digest of the names, shapes and value bits of `parameters` in order: equal digests mean
/// bitwise-equal weights.
std::uint64_t parameters_digest(const std::vector<Parameter*>& parameters);

/// Number of scalar values in `parameters`.
std::int64_t parameter_count(const std::vector<Parameter*>& parameters);

}  // namespace meshtensor::nn
