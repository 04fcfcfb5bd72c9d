#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <meshtensor/nn/module.hpp>

namespace meshtensor::pp {

/// Which blocks keep only their input in forward and run their forward again in backward.
enum class Checkpointing : std::uint8_t {
  none,       ///< every block keeps what its backward needs
  full,       ///< every block is recomputed
  selective,  ///< every second block (blocks 0, 2, 4, ... of the model) is recomputed
};

/// "none", "full" or "selective"; ParseError naming the text otherwise.
Checkpointing parse_checkpointing(const std::string& text);
/// The name parse_checkpointing reads.
std::string checkpointing_name(Checkpointing kind);

/// The blocks [first, end) of each of `stages` pipeline stages: as even as the count allows
/// (every block has the same parameters and work), the earlier stages taking one more when it
/// does not divide; the embedding goes with stage 0 and the head with the last. InvalidArgument
/// naming both counts when there are more stages than blocks.
std::vector<std::pair<std::int64_t, std::int64_t>> split_blocks(std::int64_t blocks,
                                                                std::int64_t stages);

/// One pipeline stage: consecutive units of a model (its embedding, blocks, head) run in order
/// through run_forward / run_backward, so a sharded runtime's hooks and a parallel style's
/// boundaries work on each as in the whole model. The units belong to the model, which outlives
/// the stage. Blocks marked checkpointed keep only their input in forward; backward runs their
/// forward again on it (the same bits) right before their backward.
class StageModule : public nn::Module {
 public:
  /// `units`: (name, module) in forward order; `takes_input_grad`: whether the caller wants the
  /// gradient of the stage's input (false on the first stage, whose input is token ids).
  StageModule(std::vector<std::pair<std::string, nn::Module*>> units, bool takes_input_grad);
  Tensor forward(const Tensor& input) override;
  Tensor backward(const Tensor& grad_output, nn::GradientSink& sink, bool need_input_grad) override;
  std::vector<nn::Parameter*> parameters() override;
  std::string describe() const override;
  std::vector<std::pair<std::string, nn::Module*>> children() override { return units_; }
  nn::SavedState take_saved() override;
  void restore_saved(nn::SavedState saved) override;
  /// Marks unit i checkpointed (true) or not; the units' count of flags.
  void set_checkpointed(std::vector<bool> flags);
  /// Largest kept bytes of this stage seen inside backward (after each recompute) since the
  /// last call; 0 when nothing was recomputed.
  std::int64_t take_backward_peak();

 private:
  std::vector<std::pair<std::string, nn::Module*>> units_;
  bool takes_input_grad_;
  std::vector<bool> checkpointed_;
  std::vector<Tensor> kept_inputs_;  // per unit: the input of a checkpointed unit's forward
  std::int64_t backward_peak_ = 0;
};

/// The chunks (StageModule) a pipeline rank holds, as one module tree for a sharded runtime:
/// its parameters are the chunks' in order. Its own forward runs the chunks in order (only
/// meaningful when they are consecutive stages).
class StageChunks : public nn::Module {
 public:
  explicit StageChunks(std::vector<StageModule*> chunks);
  Tensor forward(const Tensor& input) override;
  Tensor backward(const Tensor& grad_output, nn::GradientSink& sink, bool need_input_grad) override;
  std::vector<nn::Parameter*> parameters() override;
  std::string describe() const override;
  std::vector<std::pair<std::string, nn::Module*>> children() override;
  /// Chunk c.
  StageModule& chunk(std::size_t c) { return *chunks_.at(c); }
  /// Number of chunks.
  std::size_t size() const { return chunks_.size(); }

 private:
  std::vector<StageModule*> chunks_;
};

}  // namespace meshtensor::pp
