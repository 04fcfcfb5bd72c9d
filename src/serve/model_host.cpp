#include "model_host.hpp"

#include <fmt/format.h>

#include <meshtensor/comm/agree.hpp>
#include <meshtensor/core/error.hpp>
#include <meshtensor/generate/load.hpp>

namespace meshtensor::serve {

namespace {

generate::GeneratorOptions generator_options(const ServeConfig& config) {
  generate::GeneratorOptions options;
  options.max_batch = config.max_batch;
  options.prefill_chunk = config.prefill_chunk;
  options.exact_logprobs = config.mode == comm::ReductionMode::exact;
  options.cache_positions = config.max_context;
  return options;
}

}  // namespace

ModelHost::ModelHost(comm::Communicator& world, const ServeConfig& config)
    : world_(world), config_(config), tp_(generate::generation_group(world, config.mode)) {
  const generate::CheckpointLocation location =
      generate::locate_checkpoint(world_, config_.checkpoint);
  directory_ = location.directory;
  step_ = location.step;
  model_ = load(directory_, 1);
  tokenizer_ = load_tokenizer(directory_);
  batch_ = std::make_unique<generate::ContinuousBatch>(*model_, generator_options(config),
                                                       tp_.get(), config.max_batch);
}

std::unique_ptr<nn::Decoder> ModelHost::load(const std::string& directory, std::int64_t copies) {
  const std::int64_t per_process = world_.backend() == "threads" ? world_.size() : 1;
  return generate::load_for_generation(world_, directory, *tp_, config_.mode, copies * per_process);
}

std::shared_ptr<const tokenize::Tokenizer> ModelHost::load_tokenizer(
    const std::string& directory) const {
  if (world_.rank() != 0) return nullptr;
  std::shared_ptr<const tokenize::Tokenizer> tokenizer = generate::model_tokenizer(directory);
  if (config_.chat_template.empty()) return tokenizer;
  auto with_template = std::make_shared<tokenize::Tokenizer>(*tokenizer);
  with_template->set_chat_template(config_.chat_template);
  return with_template;
}

ReloadResult ModelHost::reload() {
  ReloadResult result;
  std::unique_ptr<nn::Decoder> fresh;
  std::shared_ptr<const tokenize::Tokenizer> tokenizer;
  try {
    const generate::CheckpointLocation location =
        generate::locate_checkpoint(world_, config_.checkpoint);
    result.directory = location.directory;
    result.step = location.step;
    // The old model stays until the new one is in: two copies for a moment.
    fresh = load(result.directory, 2);
    const std::string now = model_->config_text();
    const std::string next = fresh->config_text();
    if (now != next) {
      throw DataError(fmt::format(
          "checkpoint {} holds another model ({}) than the one served ({}): restart the server "
          "to serve it",
          result.directory, next, now));
    }
    // Rank 0 alone reads the tokenizer; every rank hears whether it may be served.
    std::exception_ptr failure;
    try {
      tokenizer = load_tokenizer(result.directory);
      if (tokenizer && tokenizer->name() != tokenizer_->name()) {
        throw DataError(fmt::format(
            "checkpoint {} reads tokens of the tokenizer {}, the served model those of {}: "
            "restart the server to serve it",
            result.directory, tokenizer->name(), tokenizer_->name()));
      }
    } catch (...) {
      failure = std::current_exception();
    }
    comm::throw_if_any_failed(world_, failure);
  } catch (const Error& e) {
    result.error = e.what();
    return result;
  }
  batch_.reset();
  model_ = std::move(fresh);
  tokenizer_ = std::move(tokenizer);
  batch_ = std::make_unique<generate::ContinuousBatch>(*model_, generator_options(config_),
                                                       tp_.get(), config_.max_batch);
  directory_ = result.directory;
  step_ = result.step;
  result.ok = true;
  return result;
}

}  // namespace meshtensor::serve
