#include <algorithm>
#include <cmath>
#include <numbers>

#include <fmt/format.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/nn/optim.hpp>

namespace meshtensor::nn {

std::vector<OptimizerSlot> slots_of(const std::vector<Parameter*>& parameters) {
  std::vector<OptimizerSlot> slots;
  for (Parameter* p : parameters)
    slots.push_back({p->value, p->grad});
  return slots;
}

namespace {

void check_slots(const std::vector<OptimizerSlot>& slots) {
  for (std::size_t i = 0; i < slots.size(); ++i) {
    const auto& slot = slots[i];
    if (!slot.value.defined() || !slot.grad.defined() || slot.value.dtype() != DType::f32 ||
        slot.grad.dtype() != DType::f32 || slot.value.shape() != slot.grad.shape() ||
        !slot.value.is_contiguous() || !slot.grad.is_contiguous()) {
      throw InvalidArgument(
          fmt::format("optimizer slot {} needs contiguous f32 value and gradient of one shape", i));
    }
  }
}

void check_rate(double value, const char* what) {
  if (!std::isfinite(value) || value < 0.0)
    throw InvalidArgument(fmt::format("{} {} is not a finite value >= 0", what, value));
}

std::vector<Tensor> zeros_like(const std::vector<OptimizerSlot>& slots) {
  std::vector<Tensor> out;
  for (const auto& slot : slots)
    out.emplace_back(slot.value.shape(), DType::f32);
  return out;
}

}  // namespace

std::vector<std::pair<std::string, double>> Optimizer::scalar_state() const {
  return {{"step", static_cast<double>(steps_)}};
}

void Optimizer::set_scalar_state(const std::vector<std::pair<std::string, double>>& values) {
  const auto wanted = scalar_state();
  for (const auto& [name, current] : wanted) {
    const auto found = std::find_if(values.begin(), values.end(),
                                    [&](const auto& entry) { return entry.first == name; });
    if (found == values.end())
      throw InvalidArgument(fmt::format("optimizer state '{}' is missing", name));
  }
  for (const auto& [name, current] : wanted) {
    const auto found = std::find_if(values.begin(), values.end(),
                                    [&](const auto& entry) { return entry.first == name; });
    set_scalar(name, found->second);
  }
}

void Optimizer::set_scalar(const std::string& name, double value) {
  if (name != "step") throw InvalidArgument(fmt::format("unknown optimizer state '{}'", name));
  if (!(value >= 0.0) || value != std::floor(value))
    throw InvalidArgument(fmt::format("optimizer step {} is not a count", value));
  steps_ = static_cast<std::int64_t>(value);
}

SGD::SGD(std::vector<OptimizerSlot> slots, double momentum, double weight_decay)
    : slots_(std::move(slots)), momentum_(momentum), weight_decay_(weight_decay) {
  check_slots(slots_);
  check_rate(momentum, "momentum");
  check_rate(weight_decay, "weight decay");
  if (momentum_ > 0.0) momentum_buffers_ = zeros_like(slots_);
}

void SGD::step(double lr) {
  check_rate(lr, "learning rate");
  const auto rate = static_cast<float>(lr);
  const auto decay = static_cast<float>(weight_decay_);
  const auto momentum = static_cast<float>(momentum_);
  for (std::size_t s = 0; s < slots_.size(); ++s) {
    auto w = slots_[s].value.values<float>();
    const auto grad = slots_[s].grad.values<float>();
    for (std::size_t i = 0; i < w.size(); ++i) {
      float g = grad[i];
      if (decay != 0.0f) g += decay * w[i];
      if (momentum_ > 0.0) {
        float& buffer = momentum_buffers_[s].values<float>()[i];
        buffer = steps_ == 0 ? g : momentum * buffer + g;
        g = buffer;
      }
      w[i] -= rate * g;
    }
  }
  ++steps_;
}

std::vector<std::pair<std::string, Tensor>> SGD::slot_state(std::size_t slot) {
  if (momentum_buffers_.empty()) return {};
  return {{"momentum_buffer", momentum_buffers_.at(slot)}};
}

std::vector<std::pair<std::string, Tensor>> AdamW::slot_state(std::size_t slot) {
  return {{"exp_avg", first_moments_.at(slot)}, {"exp_avg_sq", second_moments_.at(slot)}};
}

std::vector<std::pair<std::string, double>> AdamW::scalar_state() const {
  auto state = Optimizer::scalar_state();
  state.emplace_back("beta1_power", beta1_power_);
  state.emplace_back("beta2_power", beta2_power_);
  return state;
}

void AdamW::set_scalar(const std::string& name, double value) {
  if (name == "beta1_power") {
    beta1_power_ = value;
  } else if (name == "beta2_power") {
    beta2_power_ = value;
  } else {
    Optimizer::set_scalar(name, value);
  }
}

AdamW::AdamW(std::vector<OptimizerSlot> slots, double weight_decay, double beta1, double beta2,
             double epsilon)
    : slots_(std::move(slots)),
      first_moments_(zeros_like(slots_)),
      second_moments_(zeros_like(slots_)),
      weight_decay_(weight_decay),
      beta1_(beta1),
      beta2_(beta2),
      epsilon_(epsilon) {
  check_slots(slots_);
  check_rate(weight_decay, "weight decay");
  if (!(beta1 >= 0.0 && beta1 < 1.0) || !(beta2 >= 0.0 && beta2 < 1.0))
    throw InvalidArgument(fmt::format("AdamW betas ({}, {}) must lie in [0, 1)", beta1, beta2));
  if (!(epsilon > 0.0))
    throw InvalidArgument(fmt::format("AdamW epsilon {} is not positive", epsilon));
}

void AdamW::step(double lr) {
  check_rate(lr, "learning rate");
  // Powers by repeated multiplication: the same bits on every platform.
  beta1_power_ *= beta1_;
  beta2_power_ *= beta2_;
  const auto decay_factor = static_cast<float>(1.0 - lr * weight_decay_);
  const auto b1 = static_cast<float>(beta1_);
  const auto b2 = static_cast<float>(beta2_);
  const auto one_minus_b1 = static_cast<float>(1.0 - beta1_);
  const auto one_minus_b2 = static_cast<float>(1.0 - beta2_);
  const auto step_size = static_cast<float>(lr / (1.0 - beta1_power_));
  const auto inverse_correction2 = static_cast<float>(1.0 / std::sqrt(1.0 - beta2_power_));
  const auto eps = static_cast<float>(epsilon_);
  for (std::size_t s = 0; s < slots_.size(); ++s) {
    auto w = slots_[s].value.values<float>();
    const auto grad = slots_[s].grad.values<float>();
    auto m = first_moments_[s].values<float>();
    auto v = second_moments_[s].values<float>();
    for (std::size_t i = 0; i < w.size(); ++i) {
      const float g = grad[i];
      m[i] = b1 * m[i] + one_minus_b1 * g;
      v[i] = b2 * v[i] + one_minus_b2 * (g * g);
      const float denominator = std::sqrt(v[i]) * inverse_correction2 + eps;
      w[i] = w[i] * decay_factor - step_size * (m[i] / denominator);
    }
  }
  ++steps_;
}

namespace {
std::int64_t bytes_of(const std::vector<Tensor>& tensors) {
  std::int64_t total = 0;
  for (const Tensor& t : tensors)
    total += static_cast<std::int64_t>(t.nbytes());
  return total;
}
}  // namespace

std::int64_t SGD::state_bytes() const {
  return bytes_of(momentum_buffers_);
}

std::int64_t AdamW::state_bytes() const {
  return bytes_of(first_moments_) + bytes_of(second_moments_);
}

double LrSchedule::at(std::int64_t step) const {
  if (warmup_steps > 0 && step < warmup_steps)
    return base * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
  if (kind == Kind::constant) return base;
  const double span = static_cast<double>(std::max<std::int64_t>(1, total_steps - warmup_steps));
  const double progress = std::min(1.0, static_cast<double>(step - warmup_steps) / span);
  return base * 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
}

LrSchedule::Kind parse_schedule_kind(const std::string& text) {
  if (text == "constant") return LrSchedule::Kind::constant;
  if (text == "cosine") return LrSchedule::Kind::cosine;
  throw ParseError(fmt::format("unknown schedule '{}' (expected constant or cosine)", text));
}

}  // namespace meshtensor::nn
