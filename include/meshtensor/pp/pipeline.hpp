#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <tuple>
#include <vector>

#include <meshtensor/comm/communicator.hpp>
#include <meshtensor/comm/peer.hpp>
#include <meshtensor/pp/schedule.hpp>

namespace meshtensor::pp {

/// What one pipeline rank computes for its chunks; the Pipeline moves the activations and
/// gradients between the stages and calls these in the schedule's order.
class StageWork {
 public:
  virtual ~StageWork() = default;
  /// The input of stage 0 for `micro_batch`.
  virtual Tensor first_input(std::int64_t micro_batch) = 0;
  /// Shape of the f32 activation between two stages for `micro_batch` (as this rank holds it):
  /// what a receiving stage allocates.
  virtual Shape boundary_shape(std::int64_t micro_batch) = 0;
  /// The forward of `micro_batch` through chunk `chunk`.
  virtual Tensor forward(std::int64_t chunk, std::int64_t micro_batch, const Tensor& input) = 0;
  /// On the last stage: the loss of `micro_batch`'s output; returns the output's gradient.
  virtual Tensor loss_gradient(std::int64_t micro_batch, const Tensor& output) = 0;
  /// The backward of `micro_batch` through chunk `chunk`: the gradient of its input (undefined on
  /// stage 0).
  virtual Tensor backward(std::int64_t chunk, std::int64_t micro_batch,
                          const Tensor& grad_output) = 0;
};

/// Figures of one step on one rank.
struct PipelineStepStats {
  double seconds = 0;       ///< wall time of the step
  double busy_seconds = 0;  ///< in forward, loss and backward
  double wait_seconds = 0;  ///< blocked on messages from other stages
  /// Idle fraction: 1 - busy / seconds.
  double bubble() const { return seconds > 0 ? 1.0 - busy_seconds / seconds : 0.0; }
};

/// Runs a schedule on the ranks of one pipeline (the `pp` mesh dim's group): every rank calls
/// run_step with its StageWork. Stage s runs on pp rank s % ranks (chunk s / ranks). The
/// activations of stage s go to stage s + 1 and their gradients back on point-to-point links
/// of their own (one per direction and stage boundary), so every link carries its micro-batches
/// in order; sends do not wait for the receiver.
class Pipeline {
 public:
  /// Collective over `pp_group` (its size is config.ranks): creates the links.
  Pipeline(comm::Communicator& pp_group, ScheduleConfig config);
  /// The schedule.
  const ScheduleConfig& config() const { return config_; }
  /// This rank's actions.
  const std::vector<PipelineAction>& actions() const { return actions_; }
  /// The number of stages.
  std::int64_t stages() const { return config_.stages(); }
  /// True when this rank runs the last stage.
  bool has_last_stage() const;
  /// True when this rank runs stage 0.
  bool has_first_stage() const { return rank_ == 0; }
  /// One training step: every action of this rank's schedule, then waits for its sends.
  PipelineStepStats run_step(StageWork& work);
  /// Forward of micro-batch 0 through every stage (evaluation): the last stage's output,
  /// broadcast to every rank of the pipeline. Collective over the pipeline.
  Tensor forward_only(StageWork& work);

 private:
  std::int64_t rank_of(std::int64_t stage) const { return stage % config_.ranks; }
  Tensor receive(std::int64_t from_stage, std::int64_t to_stage, std::int64_t micro_batch,
                 const Shape& shape);
  void deliver(const Tensor& tensor, std::int64_t from_stage, std::int64_t to_stage,
               std::int64_t micro_batch);
  /// A message between stages: (from stage, to stage, micro-batch).
  using MessageKey = std::tuple<std::int64_t, std::int64_t, std::int64_t>;
  /// The message action `index` of this rank's schedule receives from another rank, if any.
  std::optional<MessageKey> remote_input(std::size_t index) const;
  /// Posts the receive of the next action after `index` that takes a message from another rank,
  /// so that its transfer runs while this rank computes (one receive ahead, in the order the
  /// links carry their messages).
  void post_next_receive(std::size_t index, StageWork& work);

  comm::Communicator& group_;
  ScheduleConfig config_;
  std::int64_t rank_;
  std::vector<PipelineAction> actions_;
  std::unique_ptr<comm::PeerChannels> channels_;
  std::vector<comm::Work> sends_;
  // Hand-offs between two stages of this rank (one pp rank): (from stage, to stage, micro-batch).
  std::map<MessageKey, Tensor> local_;
  /// The receive posted ahead.
  struct PostedReceive {
    MessageKey key;
    Tensor tensor;
    comm::Work work;
  };
  std::optional<PostedReceive> posted_;
};

}  // namespace meshtensor::pp
