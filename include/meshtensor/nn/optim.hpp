#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <meshtensor/core/tensor.hpp>
#include <meshtensor/nn/module.hpp>

namespace meshtensor::nn {

/// One tensor an optimizer updates: f32 values and their gradient, same shape. Any tensors will
/// do: whole parameters, or the local shards of sharded ones.
struct OptimizerSlot {
  Tensor value;
  Tensor grad;
};

/// The slots of whole parameters.
std::vector<OptimizerSlot> slots_of(const std::vector<Parameter*>& parameters);

/// Updates slots from their gradients; state (momentum, moments) is kept per slot, with the
/// slot's shape. Every update is element by element with IEEE operations only, so equal
/// gradients give equal bits on every rank.
class Optimizer {
 public:
  virtual ~Optimizer() = default;
  /// One step with learning rate `lr`.
  virtual void step(double lr) = 0;
  /// Steps taken so far.
  std::int64_t steps() const { return steps_; }
  /// Bytes of state the optimizer keeps (momentum buffers, moments).
  virtual std::int64_t state_bytes() const = 0;
  /// The state tensors of slot `slot` by name, as torch names them ("exp_avg", "exp_avg_sq",
  /// "momentum_buffer"): views of the live state (slot-shaped, f32) that a checkpoint reads and
  /// a resume overwrites.
  virtual std::vector<std::pair<std::string, Tensor>> slot_state(std::size_t slot) = 0;
  /// The scalar state by name: "step", and what else the update depends on (AdamW's running
  /// powers of the betas, kept as computed so that a resume continues with the same bits).
  virtual std::vector<std::pair<std::string, double>> scalar_state() const;
  /// Restores the values scalar_state() lists; InvalidArgument naming the first one missing.
  void set_scalar_state(const std::vector<std::pair<std::string, double>>& values);

 protected:
  /// Sets one scalar named by scalar_state() (the base handles "step").
  virtual void set_scalar(const std::string& name, double value);
  std::int64_t steps_ = 0;
};

/// SGD with momentum and (coupled) weight decay, as torch.optim.SGD:
/// g = grad + wd·w; buf = momentum·buf + g (buf = g on the first step); w -= lr·buf.
class SGD : public Optimizer {
 public:
  SGD(std::vector<OptimizerSlot> slots, double momentum, double weight_decay);
  void step(double lr) override;
  std::int64_t state_bytes() const override;
  std::vector<std::pair<std::string, Tensor>> slot_state(std::size_t slot) override;

 private:
  std::vector<OptimizerSlot> slots_;
  std::vector<Tensor> momentum_buffers_;
  double momentum_;
  double weight_decay_;
};

/// AdamW as torch.optim.AdamW: w -= lr·wd·w, then the Adam update with bias correction.
class AdamW : public Optimizer {
 public:
  AdamW(std::vector<OptimizerSlot> slots, double weight_decay, double beta1 = 0.9,
        double beta2 = 0.999, double epsilon = 1e-8);
  void step(double lr) override;
  std::int64_t state_bytes() const override;
  std::vector<std::pair<std::string, Tensor>> slot_state(std::size_t slot) override;
  std::vector<std::pair<std::string, double>> scalar_state() const override;

 private:
  void set_scalar(const std::string& name, double value) override;
  std::vector<OptimizerSlot> slots_;
  std::vector<Tensor> first_moments_;
  std::vector<Tensor> second_moments_;
  double weight_decay_;
  double beta1_;
  double beta2_;
  double epsilon_;
  double beta1_power_ = 1.0;
  double beta2_power_ = 1.0;
};

/// Learning rate per step: constant, or linear warmup then cosine decay to zero.
struct LrSchedule {
  enum class Kind : std::uint8_t { constant, cosine };
  Kind kind = Kind::constant;
  double base = 1e-3;
  std::int64_t warmup_steps = 0;  ///< steps of linear increase to `base` (both kinds)
  std::int64_t total_steps = 1;   ///< where the cosine reaches zero

  /// The rate for step `step` (0-based).
  double at(std::int64_t step) const;
};

/// "constant" or "cosine"; ParseError naming the text otherwise.
LrSchedule::Kind parse_schedule_kind(const std::string& text);

}  // namespace meshtensor::nn
