#include <algorithm>
#include <set>

#include <fmt/format.h>

#include <meshtensor/core/digest.hpp>
#include <meshtensor/core/error.hpp>
#include <meshtensor/nn/module.hpp>

namespace meshtensor::nn {

namespace {
thread_local bool weights_to_be_loaded = false;
thread_local bool loaded_weights_train = false;
}  // namespace

WeightsToBeLoaded::WeightsToBeLoaded(bool gradients)
    : outer_(weights_to_be_loaded), outer_gradients_(loaded_weights_train) {
  weights_to_be_loaded = true;
  loaded_weights_train = gradients;
}

WeightsToBeLoaded::~WeightsToBeLoaded() {
  weights_to_be_loaded = outer_;
  loaded_weights_train = outer_gradients_;
}

bool WeightsToBeLoaded::active() {
  return weights_to_be_loaded;
}

bool WeightsToBeLoaded::gradients() {
  return loaded_weights_train;
}

Tensor run_forward(Module& module, const Tensor& input) {
  Tensor x = input;
  for (ModuleBoundary* boundary : module.boundaries())
    x = boundary->input(x);
  ModuleHooks* hooks = module.hooks();
  if (hooks != nullptr) hooks->pre_forward(module);
  Tensor output = module.forward(x);
  if (hooks != nullptr) hooks->post_forward(module);
  for (ModuleBoundary* boundary : module.boundaries())
    output = boundary->output(output);
  return output;
}

void run_forward_for_backward(Module& module, const Tensor& input) {
  if (!module.boundaries().empty()) {
    (void)run_forward(module, input);
    return;
  }
  ModuleHooks* hooks = module.hooks();
  if (hooks != nullptr) hooks->pre_forward(module);
  module.forward_for_backward(input);
  if (hooks != nullptr) hooks->post_forward(module);
}

Tensor run_backward(Module& module, const Tensor& grad_output, GradientSink& sink,
                    bool need_input_grad) {
  const auto& boundaries = module.boundaries();
  Tensor dy = grad_output;
  for (auto b = boundaries.rbegin(); b != boundaries.rend(); ++b)
    dy = (*b)->output_grad(dy);
  ModuleHooks* hooks = module.hooks();
  if (hooks != nullptr) hooks->pre_backward(module);
  Tensor grad_input = module.backward(dy, sink, need_input_grad);
  if (hooks != nullptr) hooks->post_backward(module);
  if (!grad_input.defined()) return grad_input;
  for (auto b = boundaries.rbegin(); b != boundaries.rend(); ++b)
    grad_input = (*b)->input_grad(grad_input);
  return grad_input;
}

std::vector<Parameter*> parameters_of(std::initializer_list<Module*> modules) {
  std::vector<Parameter*> all;
  for (Module* m : modules)
    for (Parameter* p : m->parameters())
      all.push_back(p);
  return all;
}

void prefix_parameter_names(Module& module, const std::string& prefix) {
  for (Parameter* p : module.parameters())
    p->name = fmt::format("{}.{}", prefix, p->name);
}

void Sequential::add(std::unique_ptr<Module> module) {
  if (!module) throw InvalidArgument("Sequential::add: the module is null");
  prefix_parameter_names(*module, std::to_string(modules_.size()));
  modules_.push_back(std::move(module));
}

Tensor Sequential::forward(const Tensor& input) {
  Tensor x = input;
  for (auto& module : modules_)
    x = run_forward(*module, x);
  return x;
}

Tensor Sequential::backward(const Tensor& grad_output, GradientSink& sink, bool need_input_grad) {
  Tensor grad = grad_output;
  for (std::size_t i = modules_.size(); i-- > 0;)
    grad = run_backward(*modules_[i], grad, sink, i > 0 || need_input_grad);
  return grad;
}

std::vector<std::pair<std::string, Module*>> Sequential::children() {
  std::vector<std::pair<std::string, Module*>> named;
  for (std::size_t i = 0; i < modules_.size(); ++i)
    named.emplace_back(std::to_string(i), modules_[i].get());
  return named;
}

std::vector<Parameter*> Sequential::parameters() {
  std::vector<Parameter*> all;
  for (auto& module : modules_)
    for (Parameter* p : module->parameters())
      all.push_back(p);
  return all;
}

std::string Sequential::describe() const {
  std::string text = "Sequential(";
  for (std::size_t i = 0; i < modules_.size(); ++i)
    text += (i > 0 ? ", " : "") + modules_[i]->describe();
  return text + ")";
}

std::vector<std::int64_t> row_positions(const SequenceSplit* split, std::int64_t batch,
                                        std::int64_t length) {
  std::vector<std::int64_t> positions;
  positions.reserve(static_cast<std::size_t>(batch * length));
  for (std::int64_t b = 0; b < batch; ++b) {
    if (split != nullptr) {
      positions.insert(positions.end(), split->positions().begin(), split->positions().end());
    } else {
      for (std::int64_t t = 0; t < length; ++t)
        positions.push_back(t);
    }
  }
  return positions;
}

Tensor round_partial(const PartialSums& partial) {
  if (partial.exact == nullptr) return partial.values;
  Tensor out = Tensor::uninitialized(partial.shape, DType::f32);
  kernels::round_binned_sums(*partial.exact, 1, out);
  return out;
}

namespace {
void collect_modules(Module& module, const std::string& path,
                     std::vector<std::pair<std::string, Module*>>& out) {
  out.emplace_back(path, &module);
  for (auto& [name, child] : module.children())
    collect_modules(*child, path.empty() ? name : path + "." + name, out);
}
}  // namespace

std::vector<std::pair<std::string, Module*>> named_modules(Module& root) {
  std::vector<std::pair<std::string, Module*>> out;
  collect_modules(root, "", out);
  return out;
}

namespace {

/// Calls `fn` on every holder of kept state under `root`, in one fixed order: each module, then
/// its boundaries, then its tensor-parallel communication.
template <class Fn>
void for_each_state_holder(Module& root, Fn&& fn) {
  for (const auto& [path, module] : named_modules(root)) {
    (void)path;
    fn(*module);
    for (ModuleBoundary* boundary : module->boundaries())
      fn(*boundary);
    if (SplitCommunication* split = module->split_communication()) fn(*split);
  }
}

}  // namespace

ActivationStash ActivationStash::take(Module& root) {
  ActivationStash stash;
  for_each_state_holder(root, [&](auto& holder) { stash.states_.push_back(holder.take_saved()); });
  return stash;
}

void ActivationStash::restore(Module& root) {
  std::size_t next = 0;
  for_each_state_holder(root, [&](auto& holder) {
    if (next >= states_.size())
      throw InvalidArgument("ActivationStash::restore: the stash came from another module tree");
    holder.restore_saved(std::move(states_[next++]));
  });
  if (next != states_.size())
    throw InvalidArgument("ActivationStash::restore: the stash came from another module tree");
  states_.clear();
}

std::int64_t ActivationStash::bytes() const {
  std::set<const std::byte*> seen;
  std::int64_t total = 0;
  for (const SavedState& state : states_) {
    for (const Tensor& t : state.tensors) {
      if (!t.defined()) continue;
      if (t.is_contiguous() && t.numel() > 0 && !seen.insert(t.bytes().data()).second) continue;
      total += static_cast<std::int64_t>(t.nbytes());
    }
    total += static_cast<std::int64_t>(8 * (state.reals.size() + state.integers.size()));
  }
  return total;
}

bool ActivationStash::empty() const {
  return std::all_of(states_.begin(), states_.end(),
                     [](const SavedState& state) { return state.empty(); });
}

std::int64_t kept_bytes(Module& root) {
  ActivationStash stash = ActivationStash::take(root);
  const std::int64_t bytes = stash.bytes();
  stash.restore(root);
  return bytes;
}

std::uint64_t parameters_digest(const std::vector<Parameter*>& parameters) {
  Digest64 digest;
  for (const Parameter* p : parameters) {
    digest.update(p->name);
    digest.update_u64(p->value.digest());
  }
  return digest.finish();
}

std::int64_t parameter_count(const std::vector<Parameter*>& parameters) {
  std::int64_t count = 0;
  for (const Parameter* p : parameters)
    count += p->value.numel();
  return count;
}

}  // namespace meshtensor::nn
