#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <meshtensor/core/tensor.hpp>
#include <meshtensor/nn/mlp.hpp>
#include <meshtensor/nn/models.hpp>
#include <meshtensor/nn/module.hpp>
#include <meshtensor/tokenize/tokenizer.hpp>
#include <meshtensor/tp/tensor_parallel.hpp>
#include <meshtensor/train/dataset.hpp>
#include <meshtensor/train/text_data.hpp>

namespace meshtensor::train {

/// Samples of a task as the model takes them, with one target class per output row: an image
/// and its label, or a window of text and the token after each of its positions.
struct Batch {
  Tensor input;                       ///< f32 [samples, features] or i64 tokens [samples, length]
  std::vector<std::int32_t> targets;  ///< samples * targets_per_sample() classes, in row order
};

/// The sizes train() needs to estimate a rank's memory.
struct ModelFootprint {
  double parameters = 0;    ///< values in the whole model
  double largest_unit = 0;  ///< values in the largest parameter group
  /// Values in the largest group whose backward may run while the largest one's gradients
  /// reduce, or whose reduction may run during its backward (the next largest group).
  double next_largest_unit = 0;
  double activation_floats = 0;  ///< f32 values one sample keeps through forward and backward
  double input_floats = 0;       ///< f32 (or i64 / 2) values of one sample's input
  /// Bytes an exact weight gradient packs per sample for the largest layer (its x as term
  /// lists, 16 bytes a value, and dy as f64, 8 bytes a value): per-thread buffers kept between
  /// steps.
  double exact_scratch_bytes = 0;
  /// f32 values of one whole sequence that context parallelism gathers at once (one layer's
  /// keys, values and query side; in exact mode a weight's input and output rows): held by
  /// every rank of the cp group, not split by it.
  double sequence_gather_floats = 0;
  /// Model FLOP of one target through forward and backward (docs/performance.md, "Model FLOPs
  /// utilisation"): 6 per matmul weight (2 forward, 4 backward) and, for a decoder, 6·dim a
  /// layer per key a causal row attends to on average (context / 2 of them).
  double training_flops_per_target = 0;
};

/// What the trainer trains on: the model it builds, how the model splits into parameter groups,
/// and the data. The trainer treats every output row as a classification against its target
/// (softmax cross-entropy), so image classification and language modelling share one loop.
/// Implementations are immutable and shared by every rank of a process.
class Task {
 public:
  virtual ~Task() = default;
  /// The model and its settings, as checkpoint metadata: a resume refuses another one.
  virtual std::string architecture() const = 0;
  /// A fresh model; the same seed gives the same bits everywhere.
  virtual std::unique_ptr<nn::Module> make_model(std::uint64_t seed) const = 0;
  /// The parameter groups of `model` (made by make_model), in forward order: the modules of
  /// each group (one, or several that share a parameter).
  virtual std::vector<std::vector<nn::Module*>> parameter_groups(nn::Module& model) const = 0;
  /// Training samples in one epoch.
  virtual std::int64_t samples() const = 0;
  /// Output rows (targets) of one sample: 1 for an image, the context for a text window.
  virtual std::int64_t targets_per_sample() const = 0;
  /// Samples first .. first + count - 1 of `epoch` (0-based): a function of (seed, epoch, the
  /// sample's position) alone, so every layout sees the same global batches.
  virtual Batch train_batch(std::uint64_t seed, std::int64_t epoch, std::int64_t first,
                            std::int64_t count) const = 0;
  /// Samples of the evaluation set (test images, validation windows); 0 when there are none.
  virtual std::int64_t eval_samples() const = 0;
  /// Evaluation samples first .. first + count - 1.
  virtual Batch eval_batch(std::int64_t first, std::int64_t count) const = 0;
  /// Sizes for the memory estimate.
  virtual ModelFootprint footprint() const = 0;
  /// Text the trained model writes (language tasks; "" otherwise), drawn with `seed`: `forward`
  /// runs the model on i64 tokens [1, length] and returns its logits; every rank makes the same
  /// calls.
  virtual std::string sample(const std::function<Tensor(const Tensor&)>& forward,
                             std::uint64_t seed) const;
  /// What the evaluation set is called in reports: "test" or "validation".
  virtual std::string eval_name() const = 0;
  /// What one target is called in reports: "sample" or "token".
  virtual std::string target_name() const = 0;
  /// Number of classes a target takes (the logits' last dim).
  virtual std::int64_t classes() const = 0;
  /// InvalidArgument naming the numbers unless the model splits over `degree` tensor-parallel
  /// ranks (by default only degree 1: the model has no tensor-parallel plan).
  virtual void check_tensor_parallel(std::int64_t degree) const;
  /// Readies a new model for a run in `mode`: switches on the sums that keep its bits
  /// independent of the tensor-parallel degree in exact mode (when it has any) and, with a
  /// tensor-parallel group of more than one rank, splits it over the group with its plan
  /// (sequence parallel as the group says). Returns the (module, style) pairs applied.
  virtual std::vector<std::pair<std::string, std::string>> prepare_model(
      nn::Module& model, tp::TensorParallel* tp, comm::ReductionMode mode) const;
  /// Whether the loss sums its softmax denominators exactly in exact mode.
  virtual bool exact_loss_sums() const { return false; }
  /// Metadata a checkpoint keeps beside the architecture (a language task's tokenizer).
  virtual std::map<std::string, std::string> checkpoint_metadata() const { return {}; }
  /// Bytes of text per evaluation target (a language task's: the bytes its validation
  /// targets stand for, divided by their number), so that a loss in nats per target converts to
  /// bits per byte; 0 when the task has no text.
  virtual double eval_bytes_per_target() const { return 0; }
};

/// Classifying Fashion-MNIST (or MNIST) images with an MLP: a sample is an image (pixels / 255),
/// its target its label; epochs visit the images in epoch_order(seed, epoch); evaluation is the
/// test set.
class ImageClassification : public Task {
 public:
  /// `data` outlives the task. The model's inputs and outputs follow the data.
  ImageClassification(const Dataset& data, nn::MlpConfig model);
  std::string architecture() const override;
  std::unique_ptr<nn::Module> make_model(std::uint64_t seed) const override;
  std::vector<std::vector<nn::Module*>> parameter_groups(nn::Module& model) const override;
  std::int64_t samples() const override { return data_.train.count; }
  std::int64_t targets_per_sample() const override { return 1; }
  Batch train_batch(std::uint64_t seed, std::int64_t epoch, std::int64_t first,
                    std::int64_t count) const override;
  std::int64_t eval_samples() const override { return data_.test.count; }
  Batch eval_batch(std::int64_t first, std::int64_t count) const override;
  ModelFootprint footprint() const override;
  std::string eval_name() const override { return "test"; }
  std::string target_name() const override { return "sample"; }
  std::int64_t classes() const override { return model_.outputs; }
  /// The MLP's config (inputs and outputs set from the data).
  const nn::MlpConfig& model() const { return model_; }

 private:
  const Dataset& data_;
  nn::MlpConfig model_;
};

/// Next-token prediction on text with a decoder: the text becomes tokens by the tokenizer
/// (bytes unless given), a sample is a window of context + 1 tokens of the training tokens
/// starting at a position drawn from (seed, epoch, sample) alone, its input the first context
/// tokens and its targets the last context. An epoch has as many windows as the training tokens
/// have whole contexts. Evaluation runs over the validation tokens cut into consecutive windows
/// (at most kMaxEvalWindows).
class LanguageModelling : public Task {
 public:
  /// Most validation windows one evaluation runs.
  static constexpr std::int64_t kMaxEvalWindows = 64;
  /// Windows of `window` tokens (0: the model's context). InvalidArgument naming the window and
  /// the text's length when the training text is shorter than one window (window + 1 tokens),
  /// a window past the model's context, or the model's vocabulary is not the tokenizer's. No
  /// `tokenizer`: the byte tokenizer.
  LanguageModelling(std::shared_ptr<const TextCorpus> corpus, nn::DecoderSpec model,
                    std::shared_ptr<const tokenize::Tokenizer> tokenizer = nullptr,
                    std::int64_t window = 0);
  std::string architecture() const override;
  std::unique_ptr<nn::Module> make_model(std::uint64_t seed) const override;
  std::vector<std::vector<nn::Module*>> parameter_groups(nn::Module& model) const override;
  std::int64_t samples() const override;
  std::int64_t targets_per_sample() const override { return context_; }
  Batch train_batch(std::uint64_t seed, std::int64_t epoch, std::int64_t first,
                    std::int64_t count) const override;
  std::int64_t eval_samples() const override;
  Batch eval_batch(std::int64_t first, std::int64_t count) const override;
  ModelFootprint footprint() const override;
  std::string sample(const std::function<Tensor(const Tensor&)>& forward,
                     std::uint64_t seed) const override;
  std::string eval_name() const override { return "validation"; }
  std::string target_name() const override { return "token"; }
  std::int64_t classes() const override { return vocabulary_; }
  void check_tensor_parallel(std::int64_t degree) const override;
  std::vector<std::pair<std::string, std::string>> prepare_model(
      nn::Module& model, tp::TensorParallel* tp, comm::ReductionMode mode) const override;
  bool exact_loss_sums() const override { return true; }
  /// The decoder's config.
  const nn::DecoderSpec& model() const { return model_; }
  /// A window's length (the decoder's longest sequence unless the task was given another).
  std::int64_t context() const { return context_; }
  /// The corpus.
  const TextCorpus& corpus() const { return *corpus_; }
  /// The tokenizer.
  const tokenize::Tokenizer& tokenizer() const { return *tokenizer_; }
  /// Tokens of the training and of the validation text.
  std::int64_t train_tokens() const { return static_cast<std::int64_t>(train_ids_.size()); }
  std::int64_t validation_tokens() const {
    return static_cast<std::int64_t>(validation_ids_.size());
  }
  std::map<std::string, std::string> checkpoint_metadata() const override;
  double eval_bytes_per_target() const override { return eval_bytes_per_target_; }

 private:
  std::shared_ptr<const TextCorpus> corpus_;
  nn::DecoderSpec model_;
  std::shared_ptr<const tokenize::Tokenizer> tokenizer_;
  std::vector<std::int32_t> train_ids_;
  std::vector<std::int32_t> validation_ids_;
  std::int64_t context_;
  std::int64_t vocabulary_;
  double eval_bytes_per_target_ = 0;
};

/// A loss of `nats` per evaluation target of `task` in bits per byte of its text (nullopt for a
/// task without text).
std::optional<double> bits_per_byte(double nats, const Task& task);

/// Tokens the sample at the end of a language run generates after its prompt.
inline constexpr std::int64_t kSampleTokens = 160;

/// Temperature of that sample.
inline constexpr double kSampleTemperature = 0.8;

/// Continuation of the tokens `prompt` by `forward` (logits of i64 tokens [1, length]) for
/// `tokens` tokens, each step feeding the last `context` tokens. Temperature 0: the largest logit
/// wins (the first on ties); otherwise token c is drawn with probability ∝ exp(logit_c /
/// temperature) (in f64) by the uniform sample (seed, step): a function of the logits' bits and
/// the seed, so every rank draws the same tokens.
std::vector<std::int64_t> continuation(const std::function<Tensor(const Tensor&)>& forward,
                                       std::span<const std::int64_t> prompt, std::int64_t tokens,
                                       std::int64_t context, double temperature,
                                       std::uint64_t seed);

}  // namespace meshtensor::train
