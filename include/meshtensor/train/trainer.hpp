#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <meshtensor/comm/communicator.hpp>
#include <meshtensor/core/profile.hpp>
#include <meshtensor/fsdp/memory.hpp>
#include <meshtensor/mesh/device_mesh.hpp>
#include <meshtensor/nn/optim.hpp>
#include <meshtensor/pp/schedule.hpp>
#include <meshtensor/pp/stage.hpp>
#include <meshtensor/train/replica_link.hpp>
#include <meshtensor/train/task.hpp>

namespace meshtensor::train {

/// Which optimizer steps the weights.
enum class OptimizerKind : std::uint8_t { adamw, sgd };

/// "adamw" or "sgd"; ParseError naming the text otherwise.
OptimizerKind parse_optimizer(const std::string& text);

/// Parses a training mesh: sizes ("2x2x2") and dim names ("dp,fsdp,tp"), one name per dim, each
/// of pp (pipeline stages), dp (replicate), fsdp (shard the parameters) and tp (tensor
/// parallelism) at most once, in any order. ParseError naming the bad value: an unknown or
/// repeated name, a count of names that differs from the mesh's dims, a size that is not a
/// positive integer.
DeviceMesh parse_named_mesh(const std::string& shape, const std::string& names);

/// How the model is spread over the ranks.
enum class Strategy : std::uint8_t {
  ddp,   ///< every rank holds every parameter; gradients all-reduce over all ranks
  fsdp,  ///< parameters sharded over all ranks; gather before use, reduce-scatter gradients
  hsdp,  ///< mesh replicas x shards: sharded over the shard dim, replicated over the other
};

/// "ddp", "fsdp" or "hsdp"; ParseError naming the text otherwise.
Strategy parse_strategy(const std::string& text);
/// The name parse_strategy reads.
const char* strategy_name(Strategy strategy);

/// How micro-batches of one step reduce (FSDP2's two controls).
enum class MicroBatchMode : std::uint8_t {
  no_sync,         ///< set_requires_gradient_sync(false): sum locally, reduce once on the last
  reduce_scatter,  ///< set_requires_all_reduce(false): reduce-scatter each, all-reduce the last
};

/// "no-sync" or "reduce-scatter"; ParseError naming the text otherwise.
MicroBatchMode parse_micro_batch_mode(const std::string& text);

/// Everything a data-parallel training run depends on besides its task (model and data). The
/// same config on any number of ranks sees the same global batches in the same order.
struct TrainConfig {
  std::int64_t epochs = 10;        ///< used when steps == 0
  std::int64_t steps = 0;          ///< total optimizer steps; 0: run `epochs` whole epochs
  std::int64_t batch = 256;        ///< global batch (the last batch of an epoch may be smaller)
  std::int64_t micro_batches = 1;  ///< each rank's slice is split into this many pieces
  OptimizerKind optimizer = OptimizerKind::adamw;
  nn::LrSchedule schedule;  ///< base rate, warmup and kind; total_steps is set by train()
  double weight_decay = 0.0;
  double momentum = 0.9;  ///< SGD only
  comm::ReductionMode mode = comm::ReductionMode::ordered;
  std::uint64_t seed = 0;  ///< initial weights and the data order
  Strategy strategy = Strategy::ddp;
  /// The ranks' mesh by dim names (parse_named_mesh); when given it replaces `strategy` and
  /// `replicas`. Dims it does not name have size 1.
  std::optional<DeviceMesh> mesh;
  /// With a tp dim: norms and the residual stream on sequence shards (see tp::decoder_plan).
  bool sequence_parallel = false;
  /// Scales the gradients when their global L2 norm exceeds this (0: no clipping). The norm is
  /// one value over the whole mesh, the same bits on every rank (exact in exact mode).
  double clip_grad_norm = 0.0;
  /// After training (a GPT): generate from the first validation windows with the generator on
  /// one rank (the whole model), score the same tokens with this run's forward on its own layout,
  /// and report the largest log-probability difference (TrainResult::generator_check).
  bool verify_generator = false;
  std::int64_t replicas = 0;  ///< hsdp: size of the replicate mesh dim (0: 2, or 1 on one rank)
  bool reshard_after_forward = true;
  int prefetch = 1;  ///< groups gathered ahead; 0: none
  DType param_dtype = DType::f32;
  DType reduce_dtype = DType::f32;
  MicroBatchMode micro_batch_mode = MicroBatchMode::no_sync;
  bool trace = false;  ///< record every rank's events (TrainResult::trace)
  /// Checkpoint root to save to ("" : none): after every `save_every` steps and at the end.
  std::string save_dir;
  std::int64_t save_every = 0;  ///< 0: only at the end of the run
  int keep_checkpoints = 0;     ///< keep only the newest N under save_dir (0: all)
  /// Checkpoint (or root with LATEST) to resume from ("": start afresh). The run goes on from
  /// the saved step up to `steps` / `epochs` in total, on this config's strategy and ranks.
  std::string resume_dir;
  /// The model weights to start from (a checkpoint, a root with LATEST, or a Hugging Face folder
  /// "hf:DIR"; "": the seed's); a resume, which holds its own, goes without them. Its model and
  /// tokenizer must be the task's.
  std::string init_dir;
  /// A language model's training and validation windows hold this many tokens (0: the model's
  /// context): a published model of a long context (Qwen3's 40,960) fine-tunes on shorter ones.
  std::int64_t seq_len = 0;
  /// Stop once this many steps are done in total (0: run to the end), as a preempted job would:
  /// the schedule still spans the whole run, so a resume continues it unchanged.
  std::int64_t stop_after = 0;
  std::int64_t stop_after_epochs = 0;  ///< the same, in whole epochs (0: run to the end)
  /// Also evaluate and report after every this many steps (0: at the end of each epoch only).
  std::int64_t eval_every = 0;
  /// Generate a sample of text at the end (language tasks).
  bool sample = true;
  /// With a pp mesh dim: the order of the micro-batches' forwards and backwards on each stage
  /// (TrainConfig::micro_batches per step).
  pp::ScheduleKind pipeline_schedule = pp::ScheduleKind::one_f_one_b;
  /// Model chunks per pp rank (interleaved-1f1b); 0: 2 for interleaved-1f1b, 1 otherwise.
  std::int64_t virtual_stages = 0;
  /// Which GPT blocks recompute their forward in backward instead of keeping its activations.
  pp::Checkpointing activation_checkpointing = pp::Checkpointing::none;
};

/// The size of the mesh dim `name` (pp, dp, fsdp or tp): 1 when the mesh does not name it or
/// there is no mesh.
std::int64_t mesh_dim(const TrainConfig& config, std::string_view name);

/// True when the mesh names a dim `name` (of any size).
bool has_mesh_dim(const TrainConfig& config, std::string_view name);

/// Ranks that see different data: dp x fsdp of the mesh.
std::int64_t data_ranks(const TrainConfig& config);

/// The mesh in canonical order, e.g. "2x2x2 (dp x fsdp x tp)", or "2x1x2x2 (pp x dp x fsdp x
/// tp)" with a pp dim; "1x1x1 (dp x fsdp x tp)" without a mesh.
std::string mesh_text(const TrainConfig& config);

/// Virtual stages per pp rank `config` runs with (TrainConfig::virtual_stages resolved).
std::int64_t virtual_stages(const TrainConfig& config);

/// Defaults of a language-modelling run where the image defaults do not fit, for the command
/// line and Python alike: windows per global batch, steps, warmup steps, steps between
/// evaluations (chosen from the peer measurement in docs/performance.md).
struct LanguageDefaults {
  static constexpr std::int64_t batch = 16;
  static constexpr std::int64_t steps = 600;
  static constexpr std::int64_t warmup = 30;
  static constexpr std::int64_t eval_every = 50;
};

/// Progress inside an epoch (for a progress bar).
struct StepProgress {
  std::int64_t epoch = 0;          ///< 1-based
  std::int64_t samples_done = 0;   ///< samples of this epoch so far
  std::int64_t samples_total = 0;  ///< samples this epoch will see
  double loss = 0.0;               ///< mean loss of the last global batch
  double samples_per_second = 0.0;
  double eta_seconds = 0.0;  ///< until the end of the run
};

/// One finished period of training: an epoch, the partial epoch a --steps run ends in, or the
/// steps since the last report (TrainConfig::eval_every), with an evaluation after it.
struct EpochReport {
  std::int64_t epoch = 0;
  std::int64_t steps = 0;       ///< optimizer steps taken so far in the run
  std::int64_t samples = 0;     ///< samples of this period
  double train_loss = 0.0;      ///< mean over the period's targets (nats)
  double train_accuracy = 0.0;  ///< targets whose largest logit is the target
  double test_loss = 0.0;       ///< mean over the evaluation set's targets (NaN: no such set)
  double test_accuracy = 0.0;   ///< on the evaluation set (test images, validation text)
  double samples_per_second = 0.0;
  double targets_per_second = 0.0;  ///< tokens per second for a language task
  double seconds = 0.0;
};

/// The end of a run.
struct TrainResult {
  std::vector<EpochReport> epochs;
  double test_accuracy = 0.0;
  double test_loss = 0.0;           ///< of the last evaluation
  std::string sample;               ///< text the trained model wrote (language tasks, world rank 0)
  std::uint64_t digest = 0;         ///< of the trained weights (nn::parameters_digest)
  bool replicas_identical = false;  ///< every rank ended with the digest of rank 0
  std::int64_t steps = 0;
  std::int64_t parameters = 0;         ///< scalar values of the whole model
  std::int64_t parameter_tensors = 0;  ///< tensors the weights digest covers
  double seconds = 0.0;
  std::string mesh;                           ///< e.g. "2x4 (replicate x shard)"
  fsdp::MemoryTracker::Snapshot memory_peak;  ///< this rank's largest total, by kind
  fsdp::MemoryTracker::Snapshot memory_peak_by_kind;
  std::vector<double> step_seconds;       ///< wall time of every step (this rank)
  std::vector<double> step_wait_seconds;  ///< per step: compute waiting for communication
  /// This rank's step profile: seconds of each ProfileRow over the profiled steps (every step
  /// after the first two), which took `profiled_seconds` in all.
  ProfileSeconds profile{};
  double profiled_seconds = 0.0;
  std::int64_t profiled_steps = 0;
  /// Each profiled step's rows, in step order: step_profiles[i] is step i + 2's (step_seconds[i
  /// + 2]), so a caller can take the rows of the steps it times.
  std::vector<ProfileSeconds> step_profiles;
  std::string trace;  ///< Chrome trace JSON of every rank (world rank 0, when config.trace)
  std::int64_t resumed_step = 0;         ///< the step the run resumed at (0: started afresh)
  std::vector<std::string> checkpoints;  ///< directories saved, in order
  /// Things the caller should tell the user, on world rank 0 (e.g. a resumed run whose schedule
  /// differs from the saving run's, so that its bits cannot match an uninterrupted run).
  std::vector<std::string> warnings;
  /// The tensor-parallel plan applied: (module, style) pairs (empty without a tp dim).
  std::vector<std::pair<std::string, std::string>> parallel_plan;
  /// The tensor-parallel collectives of the first step on world rank 0, one per line.
  std::string parallel_log;
  /// The same collectives counted by "phase kind" ("forward all_gather", ...).
  std::map<std::string, std::int64_t> parallel_collectives;
  /// Digest of the whole logits of the first evaluation windows (at most 4) after training: the
  /// same bits on any layout in exact mode, tensor-parallel degree included.
  std::uint64_t logits_digest = 0;
  /// False when the task has no evaluation set (a text of fewer than 20 records): then there is
  /// no evaluation loss, no logits digest and no generator check, and `warnings` says so.
  bool evaluated = true;
  /// TrainConfig::verify_generator's figures (tokens 0 when not asked for).
  struct GeneratorCheck {
    std::int64_t tokens = 0;        ///< tokens generated and scored
    std::int64_t identical = 0;     ///< of them, with the same log-probability bits
    double largest_difference = 0;  ///< largest |generator - trainer| log-probability
  } generator_check;
  /// The global gradient norm of every step, before clipping (with clip_grad_norm).
  std::vector<double> grad_norms;
  /// With a pp mesh dim: the schedule and its figures on this rank.
  struct PipelineFigures {
    std::int64_t stages = 0;  ///< pp ranks x virtual stages (0: no pipeline)
    std::string schedule;
    std::int64_t micro_batches = 0;
    double theoretical_bubble = 0;         ///< pp::theoretical_bubble
    std::vector<double> step_bubbles;      ///< measured idle fraction of each step (this rank)
    std::vector<std::string> stage_units;  ///< per stage: "embed, blocks.0-1" ...
  } pipeline;
  /// Largest bytes of activations kept for backward at once on this rank (all micro-batches in
  /// flight, recomputed blocks included).
  std::int64_t activation_peak_bytes = 0;
  /// activation_peak_bytes of every world rank (on world rank 0).
  std::vector<std::int64_t> activation_peaks;
  /// A replica group's heals: the step it stood at after each (empty when it never healed).
  std::vector<std::int64_t> healed_steps;
  /// Seconds each of them took: receiving the state and restoring it.
  std::vector<double> heal_seconds;
  /// When each step ended, in seconds of this machine's monotonic clock (steady_clock, shared by
  /// its processes): how long after an event elsewhere a step completed.
  std::vector<double> step_end_times;
};

/// Callbacks run on world rank 0 only.
struct TrainCallbacks {
  std::function<void(const StepProgress&)> on_step;
  std::function<void(const EpochReport&)> on_epoch;
};

/// Names of the tensors a training checkpoint holds besides the parameters ("model.<name>") and
/// their optimizer state ("optimizer.<name>.<state>", "optimizer.<scalar>"): the position in the
/// data and the generator's seed, each an i64 scalar.
inline constexpr const char* kTrainStateTensors[] = {"train.step", "data.epoch",   "data.position",
                                                     "data.batch", "data.samples", "rng.seed"};

/// An upper estimate of the memory one rank of train() needs at its peak, for `ranks` ranks:
/// the full model it builds before sharding, its shards of the parameters, gradients and
/// optimizer state, the gathered parameters and gradient sums of the groups in flight (exact
/// mode's carry 28 bytes a value) and the activations of its slice of the batch. Commands check
/// it against the memory available before they start (threads ranks share one process: multiply
/// by their number).
double estimate_rank_bytes(const TrainConfig& config, const Task& task, std::int64_t ranks);

/// Refuses (ResourceError with both figures) a run whose `process_ranks` ranks in this process,
/// of `ranks` in all, would need more memory than the process has. train() calls it before any
/// rank builds its model; the command line calls it before starting the ranks.
void require_training_memory(const TrainConfig& config, const Task& task,
                             std::int64_t process_ranks, std::int64_t ranks);

/// Throws InvalidArgument naming the first value of `config` that train() would refuse for
/// `task` (before any rank starts): what a caller running several configurations checks first.
void validate_config(const TrainConfig& config, const Task& task);

/// Trains `task` data-parallel on every rank of `world` (call it on all of them) with
/// config.strategy: each of the task's units is one fsdp::ShardedModule group; every rank takes
/// its Shard(0)-style slice of every global batch and splits it into micro-batches; gradients
/// reduce in config.mode to the gradient of the mean loss over the global batch's targets
/// (divide factor: samples times targets per sample), and every rank steps on its shards. Loss
/// figures are exact sums (the same on every layout). In exact mode the weights are the same bits
/// for any strategy, mesh, rank count, micro-batch split and mode, and backend; in ordered mode the
/// replicas are the same bits on every rank and a rerun with the same layout repeats them.
///
/// With a pp mesh dim (a GPT) the blocks split into pipeline stages that run
/// config.pipeline_schedule over config.micro_batches; the exact-mode promise holds for every pp
/// degree, schedule and activation checkpointing too.
///
/// Checkpoints (config.save_dir, config.resume_dir) hold the parameters, the optimizer state,
/// the step, the position in the data order and the seed, sharded as the run holds them; a
/// resume loads them onto this run's layout, whatever the saving run's, and continues with the
/// same bits as the run that was never stopped (exact mode: on any layout; ordered mode: on the
/// same layout). The learning-rate schedule is this run's: give the resumed run the same
/// --epochs / --steps as the whole run for a cosine schedule to continue unchanged.
///
/// With `replicas` (a fault-tolerant run's replica group, ft::ReplicaGroups) the ranks are one
/// replica group of several, each a job of its own, whose FSDP replicate dimension is the
/// groups: each step the quorum's members split the global batch by sample index, a step in
/// which a member was lost is redone by the rest, and a group behind the quorum takes a live
/// member's state over the link (docs/fault-tolerance.md). Exact mode keeps its promise: the
/// weights are the bits of the run that never lost a group. One member of each quorum saves
/// the checkpoints.
TrainResult train(comm::Communicator& world, const Task& task, TrainConfig config,
                  const TrainCallbacks& callbacks = {}, ReplicaLink* replicas = nullptr);

/// What every replica group of a fault-tolerant run must share, a group of `ranks` ranks: the
/// model, the data's size, the group's layout and every setting that bears on the weights or
/// the collectives (paths, tracing and where the run stops left out), as "; "-separated
/// entries ("model gpt layers=2 ...; samples 81512; layout fsdp over 2 ranks; batch 6; ...").
std::string run_fingerprint(const TrainConfig& config, const Task& task, std::int64_t ranks);

/// A TrainConfig that validate_config and require_training_memory passed for one task on a
/// number of ranks: what a front end checks once, before it starts the ranks, and hands to
/// train() (which then checks nothing twice).
class CheckedConfig {
 public:
  /// The config checked.
  const TrainConfig& config() const { return config_; }
  /// The ranks it was checked for.
  std::int64_t ranks() const { return ranks_; }

 private:
  friend CheckedConfig check_config(TrainConfig config, const Task& task,
                                    std::int64_t process_ranks, std::int64_t ranks);
  friend TrainResult train(comm::Communicator& world, const Task& task, TrainConfig config,
                           const TrainCallbacks& callbacks, ReplicaLink* replicas);
  CheckedConfig(TrainConfig config, std::int64_t ranks)
      : config_(std::move(config)), ranks_(ranks) {}
  TrainConfig config_;
  std::int64_t ranks_ = 0;
};

/// validate_config, then require_training_memory for `process_ranks` of `ranks` ranks in this
/// process.
CheckedConfig check_config(TrainConfig config, const Task& task, std::int64_t process_ranks,
                           std::int64_t ranks);

/// train() of a config checked for `task` on world.size() ranks (InvalidArgument for another
/// count).
TrainResult train(comm::Communicator& world, const Task& task, const CheckedConfig& checked,
                  const TrainCallbacks& callbacks = {}, ReplicaLink* replicas = nullptr);

}  // namespace meshtensor::train
