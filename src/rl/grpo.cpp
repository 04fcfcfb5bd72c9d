#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <limits>
#include <memory>
#include <span>

#include <fmt/format.h>

#include <meshtensor/checkpoint/checkpoint.hpp>
#include <meshtensor/comm/agree.hpp>
#include <meshtensor/comm/binned_reduction.hpp>
#include <meshtensor/core/error.hpp>
#include <meshtensor/core/memory.hpp>
#include <meshtensor/core/random.hpp>
#include <meshtensor/generate/generator.hpp>
#include <meshtensor/generate/load.hpp>
#include <meshtensor/kernels/binned_sum.hpp>
#include <meshtensor/kernels/elementwise.hpp>
#include <meshtensor/kernels/portable_math.hpp>
#include <meshtensor/mesh/layout.hpp>
#include <meshtensor/nn/layers.hpp>
#include <meshtensor/rl/grpo.hpp>
#include <meshtensor/tp/style.hpp>
#include <meshtensor/train/model_state.hpp>
#include <meshtensor/train/settings.hpp>
#include <meshtensor/train/text_data.hpp>
#include <meshtensor/train/training_model.hpp>

namespace meshtensor::rl {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

bool same_bits(double a, double b) {
  return std::bit_cast<std::uint64_t>(a) == std::bit_cast<std::uint64_t>(b);
}

/// True for one of the tokenizer's end-of-sequence ids.
bool is_end_token(const tokenize::Tokenizer& tokenizer, std::int64_t token) {
  const std::vector<std::int64_t>& ends = tokenizer.roles().end_ids;
  return std::find(ends.begin(), ends.end(), token) != ends.end();
}

/// Prompts decoded before the first step and after the last (RlResult::before / after).
constexpr std::int64_t kShownSamples = 3;

/// The rollouts of one step, the same on every rank: for sequence q = prompt * G + sample, its
/// completion's tokens and the generator's log-probabilities (new_tokens each: a completion that
/// ended at an end-of-sequence token is padded with it, scored 0), its length, and its reward.
struct Rollouts {
  std::vector<std::int64_t> prompt_ids;  ///< pool index of each of the P prompts
  std::vector<std::int64_t> tokens;      ///< [P * G * new_tokens]
  std::vector<double> logprobs;          ///< [P * G * new_tokens]
  std::vector<std::int64_t> lengths;     ///< [P * G]: tokens up to and with its end token
  std::vector<double> rewards;           ///< [P * G]
  std::vector<double> advantages;        ///< [P * G]
};

/// One rank's comparison of the generator's log-probabilities with the trainer's.
struct ParityCounts {
  std::int64_t tokens = 0;
  std::int64_t identical = 0;
  double largest = 0;
  std::int64_t first_mismatch = std::numeric_limits<std::int64_t>::max();  ///< q * n + position
  void add(double trainer, double generator, std::int64_t token) {
    ++tokens;
    if (same_bits(trainer, generator)) {
      ++identical;
    } else {
      first_mismatch = std::min(first_mismatch, token);
    }
    largest = std::max(largest, std::abs(trainer - generator));
  }
};

/// Sums of one step's updates over its tokens (exact, the same on every layout).
enum StepSum : std::int64_t { kLoss, kKl, kClipped, kSums };

/// One GRPO run on one rank.
class RlRun {
 public:
  RlRun(comm::Communicator& world, const RlTask& task, RlConfig config,
        const RlCallbacks& callbacks);
  RlResult run();

 private:
  void build();
  void build_generator();
  void load_init();
  void resume();
  void save();
  std::vector<checkpoint::SaveItem> state();
  std::vector<generate::Request> requests(std::int64_t step,
                                          const std::vector<std::int64_t>& prompt_ids) const;
  /// Generates `requests` on this rank's replica; every rank gets every completion.
  void generate_all(const std::vector<generate::Request>& requests, Rollouts& rollouts);
  void score(Rollouts& rollouts);
  /// One optimizer step on sequences [first, first + count) of `rollouts`; with `parity`, also
  /// compares every generated token's log-probabilities.
  train::Batch sequences(const Rollouts& rollouts, std::int64_t start, std::int64_t count) const;
  void train_on(const Rollouts& rollouts, std::int64_t first, std::int64_t count, bool parity,
                bool apply, kernels::BinnedSums& sums, ParityCounts& out);
  Tensor weigh_tokens(const Rollouts& rollouts, std::int64_t start, std::int64_t count,
                      const Tensor& nll, const Tensor& reference_nll, Tensor& grad,
                      ParityCounts* parity) const;
  /// With `apply` false, only scores (no gradient, no step).
  void update(const Rollouts& rollouts, std::int64_t first, std::int64_t count, bool parity,
              bool apply, RlStepReport& report, kernels::BinnedSums& sums);
  void check_parity(const RlStepReport& report, std::int64_t first_mismatch) const;
  void start_position();
  void learn(const Rollouts& rollouts, RlStepReport& report);
  RlStepReport step();
  std::vector<RlSample> show_samples();

  comm::Communicator& world_;
  const RlTask& task_;
  RlConfig config_;
  const RlCallbacks& callbacks_;
  const Clock::time_point start_ = Clock::now();
  bool exact_ = false;
  std::int64_t trainer_ranks_ = 0;
  std::int64_t trainer_copies_ = 1;
  bool trains_ = true;     // this rank is one of the trainer's (the first copy)
  bool generates_ = true;  // this rank is one of the generator's
  std::shared_ptr<comm::Communicator> trainer_world_;
  std::unique_ptr<train::LanguageModelling> language_;
  std::unique_ptr<train::TrainingModel> policy_;
  std::unique_ptr<train::TrainingModel> reference_;
  std::shared_ptr<comm::MeshGroups> generator_groups_;
  std::unique_ptr<nn::Module> generator_model_;
  std::unique_ptr<tp::TensorParallel> generator_tp_;
  std::unique_ptr<generate::Generator> generator_;
  std::unique_ptr<WeightSync> sync_;
  SyncStats sync_generator();
  std::vector<std::int64_t> prompt_order_;
  std::int64_t step_ = 0;
  std::int64_t update_ = 0;  // optimizer steps so far
  std::int64_t length_ = 0;  // trainer rows of a sequence: prompt + new_tokens - 1
  std::int64_t prompt_tokens_ = 0;
  RlResult result_;
};

RlRun::RlRun(comm::Communicator& world, const RlTask& task, RlConfig config,
             const RlCallbacks& callbacks)
    : world_(world),
      task_(task),
      config_(std::move(config)),
      callbacks_(callbacks),
      exact_(config_.train.mode == comm::ReductionMode::exact) {
  trainer_ranks_ = trainer_rank_count(config_, world.size());
  trainer_copies_ = world.size() / std::max<std::int64_t>(1, trainer_ranks_);
  trains_ = world.rank() < trainer_ranks_;
  generates_ = world.rank() < config_.generator.ranks();
  prompt_tokens_ = static_cast<std::int64_t>(task_.prompt_tokens.front().size());
  length_ = prompt_tokens_ + config_.new_tokens - 1;
  config_.train.schedule.total_steps = config_.steps * config_.ppo_epochs * config_.minibatches;
  // The pool in a seeded order (Fisher-Yates); step s takes the next P prompts, wrapping.
  const auto pool = static_cast<std::int64_t>(task_.prompts.size());
  prompt_order_.resize(static_cast<std::size_t>(pool));
  for (std::int64_t i = 0; i < pool; ++i)
    prompt_order_[static_cast<std::size_t>(i)] = i;
  for (std::int64_t i = pool - 1; i > 0; --i) {
    const std::int64_t j = uniform_int_sample(config_.train.seed ^ 0x70726f6d707473ULL,
                                              static_cast<std::uint64_t>(i), 0, i);
    std::swap(prompt_order_[static_cast<std::size_t>(i)],
              prompt_order_[static_cast<std::size_t>(j)]);
  }
}

void RlRun::build() {
  if (!config_.init.empty()) {
    config_.model = generate::read_architecture(world_, config_.init,
                                                world_.backend() == "threads" ? world_.size() : 1);
  }
  // The trainer's windows are the rollouts' sequences (prompt and completion), not the context:
  // the memory it needs follows them.
  language_ = std::make_unique<train::LanguageModelling>(
      task_.corpus, config_.model, task_.tokenizer, std::min(length_ + 1, config_.model.context));
  validate_rl_config(config_, task_, world_.size());
  train::TrainConfig trainer = config_.train;
  trainer.batch = config_.prompts * config_.samples / config_.minibatches;
  trainer.steps = config_.steps;
  train::validate_config(trainer, *language_);
  std::exception_ptr failure;
  if (world_.rank() == 0) {
    try {
      // The trainer's peak, its reference model (values and gradients, sharded like the
      // policy), and the generator's copy of the model (split over its tp ranks).
      const double process_ranks = world_.backend() == "threads" ? world_.size() : 1.0;
      if (trainer.init_dir.empty()) trainer.init_dir = config_.init;
      const double whole = nn::decoder_model_bytes(config_.model);  // values and gradients
      double shards = trainer.strategy == train::Strategy::fsdp
                          ? static_cast<double>(trainer_ranks_)
                          : 1.0;  // hsdp: at least its replicas' worth, counted as ddp
      if (trainer.mesh) shards = static_cast<double>(train::mesh_dim(trainer, "fsdp"));
      const double per_rank = train::estimate_rank_bytes(trainer, *language_, trainer_ranks_) +
                              (config_.kl > 0 ? whole / shards : 0.0) +
                              whole / 2.0 / static_cast<double>(config_.generator.tp);
      require_memory(per_rank * process_ranks,
                     fmt::format("GRPO on model {} with {} rank(s) in this process ({} a rank)",
                                 language_->architecture(), process_ranks, format_bytes(per_rank)));
    } catch (...) {
      failure = std::current_exception();
    }
  }
  comm::throw_if_any_failed(world_, failure);
  // Ranks [0, T) train; with a bigger world, ranks [kT, (k+1)T) hold a copy of the trainer's
  // layout that the weight sync fills (no optimizer, no training).
  trainer_world_ = std::shared_ptr<comm::Communicator>(&world_, [](comm::Communicator*) {});
  if (trainer_copies_ > 1)
    trainer_world_ = world_.split(world_.rank() / trainer_ranks_, world_.rank(), {});
  // Weights read next (the init, a resume, or the sync that fills a copy) are not drawn first.
  train::TrainConfig models = config_.train;
  if (models.init_dir.empty()) models.init_dir = config_.init;
  policy_ = std::make_unique<train::TrainingModel>(*trainer_world_, *language_, models,
                                                   config_.train.seed, trains_);
  if (config_.kl > 0 && trains_) {
    reference_ = std::make_unique<train::TrainingModel>(*trainer_world_, *language_, models,
                                                        config_.train.seed, false);
  }
  result_.parameters = policy_->parameter_count();
  result_.parameter_tensors = policy_->parameter_tensors();
  result_.trainer_layout = policy_->layout().description;
  result_.generator_layout = config_.generator.describe();
  build_generator();
}

/// The generator: its own copy of the model, split over its tp dim, and the sync that fills it.
void RlRun::build_generator() {
  // Ranks past the generator's hold replicas of its layout too (filled, never generating).
  const GeneratorLayout held{world_.size() / config_.generator.tp, config_.generator.tp};
  generator_groups_ = std::make_shared<comm::MeshGroups>(
      held.mesh(), std::shared_ptr<comm::Communicator>(&world_, [](comm::Communicator*) {}));
  {
    // The sync fills every parameter before the generator first runs.
    const nn::WeightsToBeLoaded filled_by_sync;
    generator_model_ = language_->make_model(config_.train.seed);
  }
  auto& decoder = dynamic_cast<nn::Decoder&>(*generator_model_);
  const comm::ReductionMode mode = config_.generator_mode.value_or(config_.train.mode);
  const bool exact_generator = mode == comm::ReductionMode::exact;
  decoder.set_exact_sums(exact_generator);
  // The policy's products: bf16 parameters compute in bf16 on both sides.
  if (config_.train.param_dtype == DType::bf16) nn::set_compute_dtype(decoder, DType::bf16);
  generator_tp_ = std::make_unique<tp::TensorParallel>(
      generator_groups_->group(std::vector<int>{1}), mode, false);
  generate::parallelize_for_generation(decoder, *generator_tp_);
  generate::GeneratorOptions options;
  options.max_batch = config_.max_batch;
  options.prefill_chunk = config_.prefill_chunk;
  options.exact_logprobs = exact_generator;
  generator_ = std::make_unique<generate::Generator>(decoder, options, generator_tp_.get());
  generator_->check_between_steps([this] { world_.throw_if_aborted(); });
  sync_ = std::make_unique<WeightSync>(*policy_, trainer_copies_, *generator_groups_,
                                       decoder.parameters(), config_.train.mode);
  result_.joint_mesh = sync_->joint();
}

/// The policy's (and reference's) "model.*" tensors from config_.init, on this layout.
void RlRun::load_init() {
  std::vector<train::TrainingModel*> models{policy_.get()};
  if (reference_ != nullptr) models.push_back(reference_.get());
  for (train::TrainingModel* model : models)
    train::read_model_weights(*trainer_world_, config_.init, model->sharded());
}

std::vector<checkpoint::SaveItem> RlRun::state() {
  std::vector<checkpoint::SaveItem> items = policy_->state();
  if (reference_ != nullptr) {
    const std::vector<checkpoint::SaveItem> frozen = reference_->state("reference.");
    items.insert(items.end(), frozen.begin(), frozen.end());
  }
  const bool leader = trainer_world_->rank() == 0;
  Tensor step = Tensor::full(Shape{}, DType::i64, static_cast<double>(step_));
  Tensor seed = Tensor::zeros(Shape{}, DType::i64);
  seed.values<std::int64_t>()[0] = static_cast<std::int64_t>(config_.train.seed);
  items.push_back({kRlStateTensors[0], Shape{}, {}, step, leader});
  items.push_back({kRlStateTensors[1], Shape{}, {}, seed, leader});
  return items;
}

void RlRun::resume() {
  const std::string& path = config_.train.resume_dir;
  const checkpoint::Index index =
      trainer_world_->rank() == 0 ? checkpoint::read_index(path) : checkpoint::Index{};
  std::string problem;
  if (trainer_world_->rank() == 0) {
    const auto kind = index.metadata.find("kind");
    const auto architecture = index.metadata.find("architecture");
    if (kind == index.metadata.end() || kind->second != "rl") {
      problem = fmt::format(
          "checkpoint {} was not saved by an RL run (resume it with train, or "
          "start from it with `init`)",
          path);
    } else if (architecture == index.metadata.end() ||
               architecture->second != language_->architecture()) {
      problem = fmt::format("checkpoint {} holds another model than this run's '{}'", path,
                            language_->architecture());
    } else if ((reference_ != nullptr) != (index.metadata.count("reference") != 0 &&
                                           index.metadata.at("reference") == "yes")) {
      problem = fmt::format(
          "checkpoint {} was saved {} a KL reference model, and this run has {} (give the same "
          "`kl` > 0 or = 0 as the saving run)",
          path, reference_ != nullptr ? "without" : "with", reference_ != nullptr ? "one" : "none");
    }
  }
  problem = comm::broadcast_text(*trainer_world_, problem, 0);
  if (!problem.empty()) throw InvalidArgument(problem);
  std::vector<checkpoint::SaveItem> items = state();
  const std::vector<Tensor> loaded =
      checkpoint::load(*trainer_world_, path, train::load_requests(items));
  const std::int64_t step = loaded[loaded.size() - 2].values<std::int64_t>()[0];
  if (step < 0 || step > config_.steps) {
    throw InvalidArgument(
        fmt::format("checkpoint {} is at step {}, outside the {} steps of this run", path, step,
                    config_.steps));
  }
  train::restore_model_state(items, loaded, policy_->optimizer());
  step_ = step;
  update_ = step_ * config_.ppo_epochs * config_.minibatches;
  config_.train.seed = static_cast<std::uint64_t>(loaded.back().values<std::int64_t>()[0]);
  result_.resumed_step = step_;
}

void RlRun::save() {
  checkpoint::SaveOptions options;
  options.keep = config_.train.keep_checkpoints;
  options.metadata = {{"kind", "rl"},
                      {"task", task_.name},
                      {"architecture", language_->architecture()},
                      {"mesh", policy_->layout().description},
                      {"generator", config_.generator.describe()},
                      {"mode", std::string(comm::reduction_mode_name(config_.train.mode))},
                      {"reference", reference_ != nullptr ? "yes" : "no"}};
  result_.checkpoints.push_back(
      checkpoint::save(*trainer_world_, config_.train.save_dir, step_, state(), options));
}

std::vector<generate::Request> RlRun::requests(std::int64_t step,
                                               const std::vector<std::int64_t>& prompt_ids) const {
  std::vector<generate::Request> made;
  for (const std::int64_t id : prompt_ids) {
    const std::vector<std::int64_t>& prompt = task_.prompt_tokens[static_cast<std::size_t>(id)];
    for (std::int64_t sample = 0; sample < config_.samples; ++sample) {
      const std::uint64_t seed =
          mix64(mix64(mix64(config_.train.seed ^ static_cast<std::uint64_t>(step)) +
                      static_cast<std::uint64_t>(id)) +
                static_cast<std::uint64_t>(sample));
      made.push_back({prompt, config_.new_tokens, {config_.temperature, config_.top_k, seed}});
      made.back().stop_tokens = task_.tokenizer->roles().end_ids;
    }
  }
  return made;
}

void RlRun::generate_all(const std::vector<generate::Request>& all, Rollouts& rollouts) {
  const DeviceMesh mesh = config_.generator.mesh();
  const auto total = static_cast<std::int64_t>(all.size());
  const std::int64_t n = config_.new_tokens;
  // Replica k decodes requests chunk k; its tp rank 0 sends them, and every rank receives all.
  std::vector<std::int64_t> counts(static_cast<std::size_t>(world_.size()), 0);
  for (std::int64_t r = 0; r < config_.generator.ranks(); ++r) {
    const std::vector<std::int64_t> at = mesh.coordinates(r);
    if (at[1] == 0)
      counts[static_cast<std::size_t>(r)] =
          chunk_extent(total, config_.generator.replicas, at[0]).size * n;
  }
  std::vector<generate::Completion> made;
  if (generates_) {
    const Chunk mine =
        chunk_extent(total, config_.generator.replicas, mesh.coordinates(world_.rank())[0]);
    made = generator_->generate(std::vector<generate::Request>(
        all.begin() + mine.offset, all.begin() + mine.offset + mine.size));
  }
  const std::int64_t sent = counts[static_cast<std::size_t>(world_.rank())];
  Tensor tokens(Shape{sent}, DType::i64);
  Tensor logprobs(Shape{sent}, DType::f64);
  for (std::int64_t i = 0; i < sent; ++i) {
    const generate::Completion& c = made[static_cast<std::size_t>(i / n)];
    const auto at = static_cast<std::size_t>(i % n);
    const bool made_here = at < c.tokens.size();  // past an end token: padding with it
    tokens.values<std::int64_t>()[static_cast<std::size_t>(i)] =
        made_here ? c.tokens[at] : c.tokens.back();
    logprobs.values<double>()[static_cast<std::size_t>(i)] = made_here ? c.logprobs[at] : 0.0;
  }
  Tensor all_tokens(Shape{total * n}, DType::i64);
  Tensor all_logprobs(Shape{total * n}, DType::f64);
  world_.all_gather(tokens, all_tokens, counts);
  world_.all_gather(logprobs, all_logprobs, counts);
  const auto token_values = all_tokens.values<std::int64_t>();
  const auto logprob_values = all_logprobs.values<double>();
  rollouts.tokens.assign(token_values.begin(), token_values.end());
  rollouts.logprobs.assign(logprob_values.begin(), logprob_values.end());
  const std::vector<std::int64_t>& ends = task_.tokenizer->roles().end_ids;
  rollouts.lengths.assign(static_cast<std::size_t>(total), n);
  for (std::int64_t q = 0; q < total; ++q) {
    const auto first = rollouts.tokens.begin() + q * n;
    const auto end = std::find_first_of(first, first + n, ends.begin(), ends.end());
    if (end != first + n) rollouts.lengths[static_cast<std::size_t>(q)] = end - first + 1;
  }
}

/// Rewards on world rank 0 (a Python callback runs once, and its numbers are data every rank
/// shares), broadcast; then the group-relative advantages.
void RlRun::score(Rollouts& rollouts) {
  const std::int64_t g = config_.samples;
  const auto sequences = static_cast<std::int64_t>(rollouts.prompt_ids.size()) * g;
  Tensor rewards = Tensor::zeros(Shape{sequences}, DType::f64);
  std::exception_ptr failure;
  if (world_.rank() == 0) {
    for (std::int64_t q = 0; q < sequences; ++q) {
      const std::int64_t id = rollouts.prompt_ids[static_cast<std::size_t>(q / g)];
      const std::string& prompt = task_.prompts[static_cast<std::size_t>(id)];
      const auto first = rollouts.tokens.begin() + q * config_.new_tokens;
      const std::int64_t length = rollouts.lengths[static_cast<std::size_t>(q)];
      const std::int64_t text =
          length - (is_end_token(*task_.tokenizer, *(first + length - 1)) ? 1 : 0);
      const std::string completion = task_.tokenizer->decode(
          std::span<const std::int64_t>(&*first, static_cast<std::size_t>(text)));
      const auto name = [&] {
        return fmt::format("step {}, prompt {} ('{}'), sample {}", step_ + 1, q / g,
                           train::printable_text(prompt), q % g);
      };
      double value = 0;
      try {
        value = task_.reward(prompt, completion);
      } catch (const std::exception& e) {
        failure = std::make_exception_ptr(
            DataError(fmt::format("the reward of {} failed: {}", name(), e.what())));
        break;
      }
      if (!std::isfinite(value)) {
        failure = std::make_exception_ptr(
            DataError(fmt::format("the reward of {} is {}, not a finite number", name(), value)));
        break;
      }
      rewards.values<double>()[static_cast<std::size_t>(q)] = value;
    }
  }
  comm::throw_if_any_failed(world_, failure);
  world_.broadcast(rewards, 0);
  const auto values = rewards.values<double>();
  rollouts.rewards.assign(values.begin(), values.end());
  rollouts.advantages.assign(static_cast<std::size_t>(sequences), 0.0);
  for (std::int64_t p = 0; p * g < sequences; ++p) {
    const auto group = values.subspan(static_cast<std::size_t>(p * g), static_cast<std::size_t>(g));
    if (std::all_of(group.begin(), group.end(), [&](double r) { return r == group[0]; }))
      continue;  // nothing to prefer within the group
    double mean = 0;
    for (const double r : group)
      mean += r;
    mean /= static_cast<double>(g);
    double squares = 0;
    for (const double r : group)
      squares += (r - mean) * (r - mean);
    const double std = std::sqrt(squares / static_cast<double>(g - 1));
    for (std::int64_t j = 0; j < g; ++j)
      rollouts.advantages[static_cast<std::size_t>(p * g + j)] =
          (group[static_cast<std::size_t>(j)] - mean) / (std + config_.advantage_eps);
  }
}

/// One generated token's terms: the clipped surrogate (plus kl * k3), whether the clip held
/// the ratio, and `factor` = -d(loss)/d(logp), the token's weight on the cross-entropy
/// gradient (softmax - onehot = -d(logp)/d(logits)).
struct TokenTerms {
  double loss = 0;
  double kl = 0;
  double clipped = 0;
  double factor = 0;
};

TokenTerms token_terms(double logp, double old, double advantage, const RlConfig& config,
                       const double* log_reference) {
  TokenTerms terms;
  const double ratio = kernels::exp_f64(logp - old);
  const double clipped = std::clamp(ratio, 1.0 - config.clip_ratio, 1.0 + config.clip_ratio);
  const bool unclipped_wins = ratio * advantage <= clipped * advantage;
  terms.loss = -std::min(ratio * advantage, clipped * advantage);
  terms.clipped = unclipped_wins ? 0.0 : 1.0;
  terms.factor = unclipped_wins ? ratio * advantage : 0.0;
  if (log_reference != nullptr) {
    const double ratio_reference = kernels::exp_f64(*log_reference - logp);
    terms.kl = ratio_reference - (*log_reference - logp) - 1.0;
    terms.loss += config.kl * terms.kl;
    terms.factor += config.kl * (ratio_reference - 1.0);
  }
  return terms;
}

/// The trainer's input for sequences [start, start + count): each prompt and its completion but
/// the last token, and the next token of every position as its target.
train::Batch RlRun::sequences(const Rollouts& rollouts, std::int64_t start,
                              std::int64_t count) const {
  const std::int64_t n = config_.new_tokens;
  train::Batch batch{Tensor(Shape{count, length_}, DType::i64),
                     std::vector<std::int32_t>(static_cast<std::size_t>(count * length_))};
  for (std::int64_t s = 0; s < count; ++s) {
    const std::int64_t q = start + s;
    const std::int64_t id = rollouts.prompt_ids[static_cast<std::size_t>(q / config_.samples)];
    std::vector<std::int64_t> sequence = task_.prompt_tokens[static_cast<std::size_t>(id)];
    sequence.insert(sequence.end(), rollouts.tokens.begin() + q * n,
                    rollouts.tokens.begin() + (q + 1) * n);
    for (std::int64_t t = 0; t < length_; ++t) {
      const auto at = static_cast<std::size_t>(s * length_ + t);
      batch.input.values<std::int64_t>()[at] = sequence[static_cast<std::size_t>(t)];
      batch.targets[at] = static_cast<std::int32_t>(sequence[static_cast<std::size_t>(t + 1)]);
    }
  }
  return batch;
}

/// -log p of every row of `batch` under `model` (forward only, then resharded).
Tensor row_nll(train::TrainingModel& model, const train::Batch& batch) {
  kernels::BinnedSums unused(1);
  const Tensor logits = model.sharded().forward(batch.input);
  Tensor losses = model.row_losses(logits, batch.targets, unused).losses;
  model.sharded().reshard();
  return losses;
}

/// The policy's part of update() on a training rank: forward (and backward, with `apply`) of
/// this rank's slice in micro-batches, then the optimizer step; parity figures of this rank.
void RlRun::train_on(const Rollouts& rollouts, std::int64_t first, std::int64_t count, bool parity,
                     bool apply, kernels::BinnedSums& sums, ParityCounts& out) {
  fsdp::ShardedModel& sharded = policy_->sharded();
  sharded.zero_grad();
  sharded.set_gradient_divide_factor(static_cast<double>(count * config_.new_tokens));
  const Chunk slice = chunk_extent(count, policy_->data_ranks(), policy_->data_rank());
  for (std::int64_t k = 0; k < config_.train.micro_batches; ++k) {
    const Chunk micro = chunk_extent(slice.size, config_.train.micro_batches, k);
    const std::int64_t start = first + slice.offset + micro.offset;
    const train::Batch batch = sequences(rollouts, start, micro.size);
    const Tensor reference = reference_ != nullptr ? row_nll(*reference_, batch) : Tensor();
    if (apply)
      policy_->prepare_micro_batch(k, config_.train.micro_batches, config_.train.micro_batch_mode);
    kernels::BinnedSums unused(1);
    const nn::CrossEntropyResult loss =
        policy_->row_losses(sharded.forward(batch.input), batch.targets, unused);
    Tensor grad = loss.grad_logits.contiguous();
    const Tensor terms = weigh_tokens(rollouts, start, micro.size, loss.losses, reference, grad,
                                      parity ? &out : nullptr);
    if (!apply) continue;
    if (policy_->loss().counts && micro.size > 0) kernels::add_column_sums(sums, 0, terms);
    sharded.backward(grad.reshape(loss.grad_logits.shape()));
  }
  if (apply) {
    if (config_.train.clip_grad_norm > 0) policy_->clip_gradients(config_.train.clip_grad_norm);
    policy_->optimizer_step(config_.train.schedule.at(update_));
    ++update_;
  } else {
    sharded.reshard();
  }
}

/// Scales each row of `grad` (f32 [rows, local classes], the cross-entropy gradient of sequences
/// [start, start + count)) by its token's factor (0 for prompt rows), counts parity into
/// `parity` (when given, on the rank that counts losses), and returns the tokens' terms
/// (f64 [count * new_tokens, kSums]).
Tensor RlRun::weigh_tokens(const Rollouts& rollouts, std::int64_t start, std::int64_t count,
                           const Tensor& nll, const Tensor& reference_nll, Tensor& grad,
                           ParityCounts* parity) const {
  const std::int64_t n = config_.new_tokens;
  const std::int64_t classes = grad.shape()[grad.rank() - 1];
  float* rows = grad.values<float>().data();
  const bool counts = policy_->loss().counts;
  Tensor terms = Tensor::zeros(Shape{count * n, kSums}, DType::f64);
  for (std::int64_t s = 0; s < count; ++s) {
    const std::int64_t q = start + s;
    for (std::int64_t t = 0; t < length_; ++t) {
      const std::int64_t row = s * length_ + t;
      const std::int64_t position = t - (prompt_tokens_ - 1);
      double factor = 0;
      if (position >= 0 && position < rollouts.lengths[static_cast<std::size_t>(q)]) {
        const double logp = -nll.values<double>()[static_cast<std::size_t>(row)];
        const double old = rollouts.logprobs[static_cast<std::size_t>(q * n + position)];
        double log_reference = 0;
        if (reference_nll.defined())
          log_reference = -reference_nll.values<double>()[static_cast<std::size_t>(row)];
        const TokenTerms token =
            token_terms(logp, old, rollouts.advantages[static_cast<std::size_t>(q)], config_,
                        reference_nll.defined() ? &log_reference : nullptr);
        double* out = terms.values<double>().data() + (s * n + position) * kSums;
        out[kLoss] = token.loss;
        out[kKl] = token.kl;
        out[kClipped] = token.clipped;
        factor = token.factor;
        if (parity != nullptr && counts) parity->add(logp, old, q * n + position);
      }
      const auto scale = static_cast<float>(factor);
      for (std::int64_t c = 0; c < classes; ++c)
        rows[row * classes + c] *= scale;
    }
  }
  return terms;
}

void RlRun::update(const Rollouts& rollouts, std::int64_t first, std::int64_t count, bool parity,
                   bool apply, RlStepReport& report, kernels::BinnedSums& sums) {
  ParityCounts mine;
  if (trains_) train_on(rollouts, first, count, parity, apply, sums, mine);
  if (!parity) return;
  comm::CollectiveOptions sum;
  sum.op = ReduceOp::sum;
  sum.mode = comm::ReductionMode::ordered;
  Tensor counted = Tensor::full(Shape{2}, DType::f64, 0.0);
  counted.values<double>()[0] = static_cast<double>(mine.tokens);
  counted.values<double>()[1] = static_cast<double>(mine.identical);
  world_.all_reduce(counted, sum);
  comm::CollectiveOptions most = sum;
  most.op = ReduceOp::max;
  Tensor worst = Tensor::full(Shape{1}, DType::f64, mine.largest);
  world_.all_reduce(worst, most);
  comm::CollectiveOptions least = sum;
  least.op = ReduceOp::min;
  Tensor mismatch = Tensor::full(Shape{1}, DType::f64, static_cast<double>(mine.first_mismatch));
  world_.all_reduce(mismatch, least);
  const auto compared = static_cast<std::int64_t>(counted.values<double>()[0]);
  const auto same = static_cast<std::int64_t>(counted.values<double>()[1]);
  report.tokens += compared;
  report.identical += same;
  report.max_abs_diff = std::max(report.max_abs_diff, worst.values<double>()[0]);
  if (exact_ && same != compared)
    check_parity(report, static_cast<std::int64_t>(mismatch.values<double>()[0]));
}

[[noreturn]] void parity_failure(std::int64_t step, std::int64_t token, std::int64_t samples,
                                 std::int64_t new_tokens, const RlStepReport& report) {
  const std::int64_t q = token / new_tokens;
  throw DataError(fmt::format(
      "exact mode: at step {}, prompt {} sample {} position {}, the generator's log-probability "
      "differs from the trainer's ({} of {} tokens identical so far, largest difference {:.3g}): "
      "the importance ratio is not 1",
      step, q / samples, q % samples, token % new_tokens, report.identical, report.tokens,
      report.max_abs_diff));
}

void RlRun::check_parity(const RlStepReport& report, std::int64_t first_mismatch) const {
  parity_failure(step_ + 1, first_mismatch, config_.samples, config_.new_tokens, report);
}

std::vector<RlSample> RlRun::show_samples() {
  std::vector<std::int64_t> ids;
  for (std::int64_t i = 0; i < std::min<std::int64_t>(kShownSamples, prompt_order_.size()); ++i)
    ids.push_back(prompt_order_[static_cast<std::size_t>(i)]);
  sync_generator();
  std::vector<generate::Request> made = requests(-1, ids);
  std::vector<generate::Request> firsts;
  for (std::size_t i = 0; i < made.size(); i += static_cast<std::size_t>(config_.samples))
    firsts.push_back(made[i]);
  if (!generates_) return {};
  const std::vector<generate::Completion> completions = generator_->generate(firsts);
  std::vector<RlSample> samples;
  for (std::size_t i = 0; i < firsts.size(); ++i) {
    const std::string& prompt = task_.prompts[static_cast<std::size_t>(ids[i])];
    const std::string completion =
        task_.tokenizer->decode(generate::text_tokens(completions[i], firsts[i]));
    double reward = std::nan("");
    try {
      if (world_.rank() == 0) reward = task_.reward(prompt, completion);
    } catch (const std::exception&) {  // shown as NaN; a step's rewards stop the run instead
    }
    samples.push_back({prompt, completion, reward});
  }
  return samples;
}

/// Where the run starts (step and seed, from a resume on the training ranks), on every rank.
void RlRun::start_position() {
  Tensor position = Tensor::zeros(Shape{2}, DType::i64);
  position.values<std::int64_t>()[0] = step_;
  position.values<std::int64_t>()[1] = static_cast<std::int64_t>(config_.train.seed);
  world_.broadcast(position, 0);
  step_ = position.values<std::int64_t>()[0];
  config_.train.seed = static_cast<std::uint64_t>(position.values<std::int64_t>()[1]);
  update_ = step_ * config_.ppo_epochs * config_.minibatches;
  result_.resumed_step = step_;
}

/// The updates of one rollout batch: parity first (with one mini-batch the first update's
/// forward is that score; with several, a forward-only pass comes first), then the epochs of
/// mini-batches; the step's loss, KL and clip figures.
void RlRun::learn(const Rollouts& rollouts, RlStepReport& report) {
  const std::int64_t sequences = config_.prompts * config_.samples;
  kernels::BinnedSums sums(kSums);
  const bool scoring_pass = config_.minibatches > 1;
  if (scoring_pass) update(rollouts, 0, sequences, true, false, report, sums);
  for (std::int64_t epoch = 0; epoch < config_.ppo_epochs; ++epoch) {
    for (std::int64_t m = 0; m < config_.minibatches; ++m) {
      const Chunk part = chunk_extent(sequences, config_.minibatches, m);
      update(rollouts, part.offset, part.size, epoch == 0 && !scoring_pass, true, report, sums);
    }
  }
  Tensor totals(Shape{kSums}, DType::f64);
  comm::reduce_binned_sums(world_, sums, 1, totals, "rl step sums");
  const double token_updates =
      static_cast<double>(sequences * config_.new_tokens * config_.ppo_epochs);
  report.loss = totals.values<double>()[kLoss] / token_updates;
  report.kl_mean = totals.values<double>()[kKl] / token_updates;
  report.clipped_fraction = totals.values<double>()[kClipped] / token_updates;
}

/// The weight sync, then the generator's copy rounded to the trainer's parameter dtype, as the
/// trainer's own forward sees its parameters (FSDP's unshard rounds them).
SyncStats RlRun::sync_generator() {
  SyncStats report = sync_->run();
  const DType dtype = config_.train.param_dtype;
  if (dtype != DType::f32) {
    for (nn::Parameter* p : generator_model_->parameters())
      p->value.copy_from(kernels::rounded_values(p->value, dtype));
  }
  return report;
}

/// One step: sync, rollouts, rewards, updates.
RlStepReport RlRun::step() {
  RlStepReport report;
  report.step = step_ + 1;
  report.sync = sync_generator();
  report.sync_seconds = report.sync.seconds;
  if (config_.compare_naive_sync && trainer_copies_ == 1 &&
      config_.generator.ranks() == world_.size()) {
    report.naive_sync_seconds =
        naive_weight_sync(*policy_, config_.generator.mesh(),
                          dynamic_cast<nn::Decoder&>(*generator_model_).parameters())
            .seconds;
  }
  Rollouts rollouts;
  for (std::int64_t i = 0; i < config_.prompts; ++i) {
    const auto at = static_cast<std::size_t>((step_ * config_.prompts + i) %
                                             static_cast<std::int64_t>(prompt_order_.size()));
    rollouts.prompt_ids.push_back(prompt_order_[at]);
  }
  auto phase = Clock::now();
  generate_all(requests(step_, rollouts.prompt_ids), rollouts);
  report.generate_seconds = seconds_since(phase);
  score(rollouts);
  double reward_sum = 0;
  for (const double r : rollouts.rewards)
    reward_sum += r;
  report.reward_mean = reward_sum / static_cast<double>(rollouts.rewards.size());
  phase = Clock::now();
  learn(rollouts, report);
  report.train_seconds = seconds_since(phase);
  return report;
}

RlResult RlRun::run() {
  build();
  if (trains_ && !config_.init.empty()) load_init();
  if (trains_ && !config_.train.resume_dir.empty()) resume();
  start_position();
  std::int64_t last = config_.steps;
  if (config_.train.stop_after > 0) last = std::min(last, config_.train.stop_after);
  result_.before = show_samples();
  while (step_ < last) {
    const RlStepReport report = step();
    ++step_;
    result_.tokens += report.tokens;
    result_.identical += report.identical;
    result_.max_abs_diff = std::max(result_.max_abs_diff, report.max_abs_diff);
    result_.steps.push_back(report);
    const std::int64_t every = config_.train.save_every;
    if (trains_ && !config_.train.save_dir.empty() &&
        ((every > 0 && step_ % every == 0) || step_ == last))
      save();
    if (world_.rank() == 0 && callbacks_.on_step) callbacks_.on_step(report);
  }
  result_.after = show_samples();
  Tensor digest = Tensor::zeros(Shape{1}, DType::i64);
  digest.values<std::int64_t>()[0] = static_cast<std::int64_t>(policy_->full_digest());
  world_.broadcast(digest, 0);  // the training ranks' (copies hold the last sync's weights)
  result_.weights_digest = static_cast<std::uint64_t>(digest.values<std::int64_t>()[0]);
  result_.seconds = seconds_since(start_);
  return std::move(result_);
}

std::string rl_description(const RlConfig& c, const RlTask& task) {
  return fmt::format(
      "task {} ({} prompts, tokenizer {}) init '{}' model {} steps {} P {} G {} new {} temp {} "
      "top_k {} clip {} "
      "kl {} epochs {} minibatches {} eps {} slots {} chunk {} generator {} naive {} generator "
      "mode {} trainer {}",
      task.name, task.prompts.size(), task.tokenizer ? task.tokenizer->name() : "none", c.init,
      nn::decoder_spec_text(c.model), c.steps, c.prompts, c.samples, c.new_tokens, c.temperature,
      c.top_k, c.clip_ratio, c.kl, c.ppo_epochs, c.minibatches, c.advantage_eps, c.max_batch,
      c.prefill_chunk, c.generator.describe(), c.compare_naive_sync,
      c.generator_mode ? comm::reduction_mode_name(*c.generator_mode) : "as the trainer",
      train::settings_json(c.train).dump());
}

}  // namespace

std::int64_t trainer_rank_count(const RlConfig& config, std::int64_t world_ranks) {
  if (config.train.mesh) return config.train.mesh->size();
  return config.trainer_ranks > 0 ? config.trainer_ranks : world_ranks;
}

std::int64_t rl_world_ranks(const RlConfig& config) {
  return std::max(trainer_rank_count(config, config.generator.ranks()), config.generator.ranks());
}

namespace {

/// The counts and numbers of `config` alone.
void validate_settings(const RlConfig& config) {
  const auto positive = [](std::int64_t value, const char* what) {
    if (value < 1) throw InvalidArgument(fmt::format("{} must be at least 1, got {}", what, value));
  };
  positive(config.steps, "the number of steps");
  positive(config.prompts, "the number of prompts per step");
  positive(config.new_tokens, "the number of new tokens");
  positive(config.ppo_epochs, "the number of PPO epochs");
  positive(config.minibatches, "the number of mini-batches");
  positive(config.max_batch, "the generator's batch");
  positive(config.prefill_chunk, "the prefill chunk");
  if (config.samples < 2) {
    throw InvalidArgument(fmt::format(
        "GRPO compares the completions of one prompt with each other: give at least 2 samples "
        "per prompt, got {}",
        config.samples));
  }
  const std::int64_t sequences = config.prompts * config.samples;
  if (config.minibatches > sequences) {
    throw InvalidArgument(fmt::format("{} mini-batches is more than the {} completions of a step",
                                      config.minibatches, sequences));
  }
  if (config.train.micro_batches > sequences / config.minibatches) {
    throw InvalidArgument(
        fmt::format("{} micro-batches is more than the {} completions of a mini-batch",
                    config.train.micro_batches, sequences / config.minibatches));
  }
  const auto within = [](double value, bool ok, const char* what, const char* range) {
    if (!ok) throw InvalidArgument(fmt::format("{} must be within {}, got {}", what, range, value));
  };
  within(config.kl, config.kl >= 0 && config.kl <= 1e6, "the KL coefficient", "[0, 1e6]");
  within(config.clip_ratio, config.clip_ratio > 0 && config.clip_ratio < 1, "the clip ratio",
         "(0, 1)");
  if (!(config.temperature > 0 && config.temperature <= 1e3)) {
    throw InvalidArgument(fmt::format(
        "the sampling temperature must be within (0, 1000], got {} (GRPO needs different "
        "completions of a prompt)",
        config.temperature));
  }
  within(config.advantage_eps, config.advantage_eps > 0 && config.advantage_eps <= 1,
         "the advantage epsilon", "(0, 1]");
  if (config.top_k < 0) throw InvalidArgument(fmt::format("top_k {} is negative", config.top_k));
}

/// The trainer's and the generator's rank counts against the world's.
void validate_layouts(const RlConfig& config, std::int64_t world_ranks) {
  const GeneratorLayout& g = config.generator;
  if (g.replicas < 1 || g.tp < 1)
    throw InvalidArgument(fmt::format("the generator layout {} has no rank", g.describe()));
  if (config.train.mesh && config.trainer_ranks > 0 &&
      config.trainer_ranks != config.train.mesh->size()) {
    throw InvalidArgument(fmt::format("the trainer's mesh {} has {} ranks, not {}",
                                      train::mesh_text(config.train), config.train.mesh->size(),
                                      config.trainer_ranks));
  }
  const std::int64_t t = trainer_rank_count(config, world_ranks);
  if (std::max(t, g.ranks()) != world_ranks || world_ranks % t != 0 ||
      world_ranks % g.ranks() != 0) {
    throw InvalidArgument(fmt::format(
        "the trainer on {} rank(s) and the generator {} on {} rank(s) do not share a world of {} "
        "ranks: the world has as many ranks as the larger of the two, and the smaller count "
        "divides it",
        t, g.describe(), g.ranks(), world_ranks));
  }
  tp::check_decoder_degree(config.model, g.tp);
}

}  // namespace

void validate_rl_config(const RlConfig& config, const RlTask& task, std::int64_t world_ranks) {
  validate_settings(config);
  if (task.prompt_tokens.empty() || !task.tokenizer)
    throw InvalidArgument(fmt::format("task {} has no tokenized prompt", task.name));
  const auto prompt = static_cast<std::int64_t>(task.prompt_tokens.front().size());
  for (std::size_t i = 0; i < task.prompt_tokens.size(); ++i) {
    if (static_cast<std::int64_t>(task.prompt_tokens[i].size()) != prompt || prompt == 0) {
      throw InvalidArgument(fmt::format("task {}: prompt {} has {} tokens, prompt 0 {}", task.name,
                                        i, task.prompt_tokens[i].size(), prompt));
    }
  }
  if (task.tokenizer->vocabulary() != config.model.vocabulary) {
    throw InvalidArgument(
        fmt::format("task {}: the tokenizer {} has {} tokens, the model's vocabulary {}", task.name,
                    task.tokenizer->name(), task.tokenizer->vocabulary(), config.model.vocabulary));
  }
  if (prompt + config.new_tokens > config.model.context) {
    throw InvalidArgument(
        fmt::format("a prompt of {} tokens and {} new tokens do not fit the model's context of {}",
                    prompt, config.new_tokens, config.model.context));
  }
  validate_layouts(config, world_ranks);
}

RlResult run_rl(comm::Communicator& world, const RlTask& task, RlConfig config,
                const RlCallbacks& callbacks) {
  comm::check_same_on_every_rank(world, "run_rl()'s task and configuration",
                                 rl_description(config, task));
  RlRun run(world, task, std::move(config), callbacks);
  return run.run();
}

}  // namespace meshtensor::rl
