#include "model_host.hpp"

#include <fmt/format.h>

#include <meshtensor/checkpoint/checkpoint.hpp>
#include <meshtensor/comm/agree.hpp>
#include <meshtensor/core/error.hpp>
#include <meshtensor/generate/load.hpp>
#include <meshtensor/tp/style.hpp>

namespace meshtensor::serve {

namespace {

generate::GeneratorOptions generator_options(const ServeConfig& config) {
  generate::GeneratorOptions options;
  options.max_batch = config.max_batch;
  options.prefill_chunk = config.prefill_chunk;
  options.exact_logprobs = config.mode == comm::ReductionMode::exact;
  return options;
}

}  // namespace

ModelHost::ModelHost(comm::Communicator& world, const ServeConfig& config)
    : world_(world), config_(config) {
  tp_ = std::make_unique<tp::TensorParallel>(
      std::shared_ptr<comm::Communicator>(&world, [](comm::Communicator*) {}), config.mode, false);
  std::tie(directory_, step_) = locate();
  model_ = load(directory_, 1);
  batch_ = std::make_unique<generate::ContinuousBatch>(*model_, generator_options(config),
                                                       tp_.get(), config.max_batch);
}

std::pair<std::string, std::int64_t> ModelHost::locate() {
  std::string directory;
  std::int64_t step = 0;
  std::exception_ptr failure;
  if (world_.rank() == 0) {
    try {
      directory = checkpoint::resolve(config_.checkpoint);
      step = checkpoint::read_index(directory).step;
    } catch (...) {
      failure = std::current_exception();
    }
  }
  comm::throw_if_any_failed(world_, failure);
  directory = comm::broadcast_text(world_, directory, 0);
  step = std::stoll(comm::broadcast_text(world_, std::to_string(step), 0));
  return {directory, step};
}

std::unique_ptr<nn::Gpt> ModelHost::load(const std::string& directory, std::int64_t copies) {
  const std::int64_t per_process = world_.backend() == "threads" ? world_.size() : 1;
  std::unique_ptr<nn::Gpt> model = generate::load_gpt(world_, directory, copies * per_process);
  model->set_exact_sums(config_.mode == comm::ReductionMode::exact);
  if (tp_->size() > 1) {
    tp::check_gpt_degree(model->config(), tp_->size());
    tp::parallelize_module(*model, *tp_, tp::gpt_plan(false));
  }
  return model;
}

ReloadResult ModelHost::reload() {
  ReloadResult result;
  std::unique_ptr<nn::Gpt> fresh;
  try {
    std::tie(result.directory, result.step) = locate();
    // The old model stays until the new one is in: two copies for a moment.
    fresh = load(result.directory, 2);
    const std::string now = nn::gpt_config_text(model_->config());
    const std::string next = nn::gpt_config_text(fresh->config());
    if (now != next) {
      throw DataError(fmt::format(
          "checkpoint {} holds another model ({}) than the one served ({}): restart the server "
          "to serve it",
          result.directory, next, now));
    }
  } catch (const Error& e) {
    result.error = e.what();
    return result;
  }
  batch_.reset();
  model_ = std::move(fresh);
  batch_ = std::make_unique<generate::ContinuousBatch>(*model_, generator_options(config_),
                                                       tp_.get(), config_.max_batch);
  directory_ = result.directory;
  step_ = result.step;
  result.ok = true;
  return result;
}

}  // namespace meshtensor::serve
