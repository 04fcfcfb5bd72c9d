#pragma once

#include <memory>
#include <string>

#include <meshtensor/comm/communicator.hpp>
#include <meshtensor/generate/continuous_batch.hpp>
#include <meshtensor/generate/load.hpp>
#include <meshtensor/serve/scheduler.hpp>
#include <meshtensor/serve/server.hpp>

namespace meshtensor::serve {

/// The served model on one rank: the decoder of the checkpoint, split over the world by tensor
/// parallelism, and the continuous batch over it. Loading is collective.
class ModelHost {
 public:
  /// Loads `config.checkpoint` (collective); throws on every rank when it cannot be served.
  ModelHost(comm::Communicator& world, const ServeConfig& config);
  /// Loads the checkpoint again (collective; nothing may be running): a newer LATEST, or the
  /// same weights. Failures (a damaged checkpoint, another architecture) keep the old model and
  /// are reported, on every rank.
  ReloadResult reload();
  generate::ContinuousBatch& batch() { return *batch_; }
  nn::DecoderSpec config() const { return model_->decoder_spec(); }
  /// The model's tokenizer (on world rank 0, which speaks HTTP; null on the others).
  std::shared_ptr<const tokenize::Tokenizer> tokenizer() const { return tokenizer_; }
  std::int64_t step() const { return step_; }
  const std::string& directory() const { return directory_; }

 private:
  std::unique_ptr<nn::Decoder> load(const std::string& directory, std::int64_t copies);
  /// The tokenizer of the checkpoint `directory` on world rank 0 (null on the others).
  std::shared_ptr<const tokenize::Tokenizer> load_tokenizer(const std::string& directory) const;

  comm::Communicator& world_;
  const ServeConfig& config_;
  std::unique_ptr<tp::TensorParallel> tp_;
  std::unique_ptr<nn::Decoder> model_;
  std::unique_ptr<generate::ContinuousBatch> batch_;
  std::shared_ptr<const tokenize::Tokenizer> tokenizer_;
  std::int64_t step_ = 0;
  std::string directory_;
};

}  // namespace meshtensor::serve
