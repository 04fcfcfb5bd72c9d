#include <algorithm>

#include <fmt/format.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/pp/stage.hpp>

namespace meshtensor::pp {

Checkpointing parse_checkpointing(const std::string& text) {
  if (text == "none") return Checkpointing::none;
  if (text == "full") return Checkpointing::full;
  if (text == "selective") return Checkpointing::selective;
  throw ParseError(fmt::format(
      "unknown activation checkpointing '{}' (expected none, full or selective)", text));
}

std::string checkpointing_name(Checkpointing kind) {
  switch (kind) {
    case Checkpointing::none:
      return "none";
    case Checkpointing::full:
      return "full";
    case Checkpointing::selective:
      return "selective";
  }
  return "?";
}

std::vector<std::pair<std::int64_t, std::int64_t>> split_blocks(std::int64_t blocks,
                                                                std::int64_t stages) {
  if (stages < 1 || stages > blocks) {
    throw InvalidArgument(fmt::format(
        "{} pipeline stages for a model of {} blocks: every stage needs at least one block "
        "(give at most {} stages: pp size times virtual stages)",
        stages, blocks, blocks));
  }
  std::vector<std::pair<std::int64_t, std::int64_t>> split;
  std::int64_t first = 0;
  for (std::int64_t s = 0; s < stages; ++s) {
    const std::int64_t count = blocks / stages + (s < blocks % stages ? 1 : 0);
    split.emplace_back(first, first + count);
    first += count;
  }
  return split;
}

StageModule::StageModule(std::vector<std::pair<std::string, nn::Module*>> units,
                         bool takes_input_grad)
    : units_(std::move(units)),
      takes_input_grad_(takes_input_grad),
      checkpointed_(units_.size(), false),
      kept_inputs_(units_.size()) {
  if (units_.empty()) throw InvalidArgument("a pipeline stage needs at least one unit");
}

void StageModule::set_checkpointed(std::vector<bool> flags) {
  if (flags.size() != units_.size()) {
    throw InvalidArgument(
        fmt::format("{} checkpointing flags for a stage of {} units", flags.size(), units_.size()));
  }
  checkpointed_ = std::move(flags);
}

Tensor StageModule::forward(const Tensor& input) {
  Tensor x = input;
  for (std::size_t i = 0; i < units_.size(); ++i) {
    nn::Module& unit = *units_[i].second;
    Tensor y = nn::run_forward(unit, x);
    if (checkpointed_[i]) {
      nn::ActivationStash::take(unit);  // dropped: backward recomputes it from the input
      kept_inputs_[i] = x;
    }
    x = std::move(y);
  }
  return x;
}

Tensor StageModule::backward(const Tensor& grad_output, nn::GradientSink& sink,
                             bool need_input_grad) {
  Tensor grad = grad_output;
  for (std::size_t i = units_.size(); i-- > 0;) {
    nn::Module& unit = *units_[i].second;
    if (checkpointed_[i]) {
      if (!kept_inputs_[i].defined())
        throw InvalidArgument(units_[i].first + ": backward without a forward");
      nn::run_forward_for_backward(unit, std::exchange(kept_inputs_[i], Tensor()));
      backward_peak_ = std::max(backward_peak_, nn::kept_bytes(*this));
    }
    const bool wants = i > 0 || (takes_input_grad_ && need_input_grad);
    grad = nn::run_backward(unit, grad, sink, wants);
  }
  return grad;
}

std::int64_t StageModule::take_backward_peak() {
  return std::exchange(backward_peak_, 0);
}

nn::SavedState StageModule::take_saved() {
  nn::SavedState saved;
  for (Tensor& input : kept_inputs_)
    saved.tensors.push_back(std::exchange(input, Tensor()));
  return saved;
}

void StageModule::restore_saved(nn::SavedState saved) {
  if (saved.tensors.size() != kept_inputs_.size())
    throw InvalidArgument("StageModule::restore_saved: the state of another stage");
  for (std::size_t i = 0; i < kept_inputs_.size(); ++i)
    kept_inputs_[i] = std::move(saved.tensors[i]);
}

std::vector<nn::Parameter*> StageModule::parameters() {
  std::vector<nn::Parameter*> all;
  for (const auto& [name, unit] : units_)
    for (nn::Parameter* p : unit->parameters())
      all.push_back(p);
  return all;
}

std::string StageModule::describe() const {
  return fmt::format("Stage({} .. {})", units_.front().first, units_.back().first);
}

StageChunks::StageChunks(std::vector<StageModule*> chunks) : chunks_(std::move(chunks)) {}

Tensor StageChunks::forward(const Tensor& input) {
  Tensor x = input;
  for (StageModule* chunk : chunks_)
    x = nn::run_forward(*chunk, x);
  return x;
}

Tensor StageChunks::backward(const Tensor& grad_output, nn::GradientSink& sink,
                             bool need_input_grad) {
  Tensor grad = grad_output;
  for (std::size_t c = chunks_.size(); c-- > 0;)
    grad = nn::run_backward(*chunks_[c], grad, sink, c > 0 || need_input_grad);
  return grad;
}

std::vector<nn::Parameter*> StageChunks::parameters() {
  std::vector<nn::Parameter*> all;
  for (StageModule* chunk : chunks_)
    for (nn::Parameter* p : chunk->parameters())
      all.push_back(p);
  return all;
}

std::string StageChunks::describe() const {
  return fmt::format("StageChunks({})", chunks_.size());
}

std::vector<std::pair<std::string, nn::Module*>> StageChunks::children() {
  std::vector<std::pair<std::string, nn::Module*>> all;
  for (std::size_t c = 0; c < chunks_.size(); ++c)
    all.emplace_back(fmt::format("chunk{}", c), chunks_[c]);
  return all;
}

}  // namespace meshtensor::pp
