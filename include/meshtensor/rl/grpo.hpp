#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <meshtensor/comm/communicator.hpp>
#include <meshtensor/nn/models.hpp>
#include <meshtensor/rl/rewards.hpp>
#include <meshtensor/rl/weight_sync.hpp>
#include <meshtensor/train/trainer.hpp>

namespace meshtensor::rl {

/// Everything a GRPO run depends on besides its task.
struct RlConfig {
  /// The trainer: its layout (strategy or named mesh, sequence parallel, micro-batches), mode,
  /// optimizer, learning rate (schedule over every update), weight decay, gradient clipping,
  /// seed, and checkpoints (save_dir, save_every, keep_checkpoints, resume_dir, stop_after).
  /// Its batch and steps are set from the fields below.
  train::TrainConfig train;
  /// Ranks the trainer runs on (0: every rank of the world; a named mesh gives its own count).
  std::int64_t trainer_ranks = 0;
  /// The generator's layout. The trainer takes ranks [0, T) of the world and the generator
  /// [0, G); the world has max(T, G) ranks and the smaller count divides the larger.
  GeneratorLayout generator;
  /// Checkpoint (or root with LATEST) whose "model.*" tensors start the policy (and the
  /// reference); "": fresh weights of `model` from the seed.
  std::string init;
  /// The policy's architecture when there is no `init` (with one, the checkpoint's).
  nn::DecoderSpec model;
  std::int64_t steps = 20;       ///< rollout batches (each: generate, score, update)
  std::int64_t prompts = 8;      ///< P: prompts per step
  std::int64_t samples = 4;      ///< G: completions per prompt (at least 2: a group)
  std::int64_t new_tokens = 24;  ///< tokens of every completion
  double temperature = 1.0;      ///< sampling temperature (> 0)
  std::int64_t top_k = 0;        ///< 0: all tokens
  double clip_ratio = 0.2;       ///< PPO's epsilon: the ratio is clipped to [1 - e, 1 + e]
  double kl = 0.0;               ///< coefficient of the k3 KL to the frozen reference (0: none)
  std::int64_t ppo_epochs = 1;   ///< passes over each rollout batch
  std::int64_t minibatches = 1;  ///< optimizer steps per pass (the batch split in order)
  double advantage_eps = 1e-4;   ///< (r - mean) / (std + eps)
  std::int64_t max_batch = 32;   ///< generator slots (requests decoded together)
  std::int64_t prefill_chunk = 64;
  /// The generator's sums (default: the trainer's mode). An ordered generator beside an exact
  /// trainer computes its log-probabilities with other roundings, so its tokens' bits differ
  /// from the trainer's, which exact mode refuses at the first such token: a way to see the
  /// check at work.
  std::optional<comm::ReductionMode> generator_mode;
  /// Also measure the naive sync (gather on rank 0, broadcast) once per step, for the report.
  bool compare_naive_sync = false;
};

/// What one step did.
struct RlStepReport {
  std::int64_t step = 0;        ///< 1-based
  double reward_mean = 0;       ///< over the step's completions
  std::int64_t tokens = 0;      ///< generated tokens compared with the trainer's
  std::int64_t identical = 0;   ///< of them, with the trainer's bits
  double max_abs_diff = 0;      ///< largest |generator - trainer| log-probability
  double kl_mean = 0;           ///< mean k3 estimate per token (0 without a reference)
  double loss = 0;              ///< mean clipped-surrogate loss per token over the updates
  double clipped_fraction = 0;  ///< tokens whose ratio was clipped, over the updates
  double generate_seconds = 0;
  double train_seconds = 0;
  double sync_seconds = 0;
  double naive_sync_seconds = 0;  ///< with compare_naive_sync
  SyncStats sync;
};

/// A prompt and one completion of it, as bytes.
struct RlSample {
  std::string prompt;
  std::string completion;
  double reward = 0;
};

/// The end of a run.
struct RlResult {
  std::vector<RlStepReport> steps;   ///< the steps this call ran
  std::uint64_t weights_digest = 0;  ///< of the policy's whole parameters
  std::int64_t tokens = 0;           ///< parity over every step: tokens compared
  std::int64_t identical = 0;
  double max_abs_diff = 0;
  std::vector<RlSample> before;  ///< the first prompts, sampled before the first step
  std::vector<RlSample> after;   ///< the same prompts and seeds after the last
  std::string trainer_layout;
  std::string generator_layout;
  bool joint_mesh = false;  ///< the sync ran on a joint mesh of both layouts
  std::int64_t resumed_step = 0;
  std::int64_t parameters = 0;         ///< scalar values of the whole model
  std::int64_t parameter_tensors = 0;  ///< tensors the weights digest covers
  std::vector<std::string> checkpoints;
  std::vector<std::string> warnings;
  double seconds = 0;
};

/// Callbacks run on world rank 0.
struct RlCallbacks {
  std::function<void(const RlStepReport&)> on_step;
};

/// The trainer's rank count: its named mesh's, else trainer_ranks (0: `world_ranks`).
std::int64_t trainer_rank_count(const RlConfig& config, std::int64_t world_ranks);

/// The ranks a run needs: max(trainer ranks, generator ranks), with the trainer's count taken
/// from its named mesh or trainer_ranks (0: the generator's count).
std::int64_t rl_world_ranks(const RlConfig& config);

/// Throws InvalidArgument naming the first value of `config` that run_rl() refuses for `task`
/// (before any rank starts): counts below 1, G = 1, a negative KL, a clip ratio outside (0, 1),
/// a temperature <= 0, prompts plus completion longer than the context, a generator layout that
/// does not cover the world or that the model does not split over, and the trainer's checks.
void validate_rl_config(const RlConfig& config, const RlTask& task, std::int64_t world_ranks);

/// GRPO on every rank of `world` (call it on all of them): each step syncs the policy's
/// weights to the generator (WeightSync), generates G completions of each of P prompts (the
/// generator's replicas split them; each completion seeded by (seed, step, prompt, sample)),
/// scores them with the task's reward on world rank 0 (broadcast), takes group-relative
/// advantages ((r - mean) / (std + eps), std with G - 1; a group of equal rewards gets 0), and
/// updates the policy with the PPO-clipped surrogate (plus kl * k3 to the reference) on its own
/// per-token log-probabilities against the generator's, mean over tokens. Every generated
/// token's generator log-probability is compared with the trainer's; in exact mode a difference
/// throws DataError naming the step, prompt, sample and position.
RlResult run_rl(comm::Communicator& world, const RlTask& task, RlConfig config,
                const RlCallbacks& callbacks = {});

/// Names of the scalars an RL checkpoint holds besides "model.*", "optimizer.*" and (with a KL)
/// "reference.*": the next step and the seed, each an i64 scalar.
inline constexpr const char* kRlStateTensors[] = {"rl.step", "rl.seed"};

}  // namespace meshtensor::rl
