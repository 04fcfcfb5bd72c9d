#include <chrono>

#include <fmt/format.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/pp/pipeline.hpp>

namespace meshtensor::pp {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

/// Tag of the link from stage `from` to the neighbouring stage `to`: activations of the boundary
/// (s, s + 1) travel on tag 2s, their gradients back on 2s + 1.
std::int64_t link_tag(std::int64_t from, std::int64_t to) {
  return from < to ? 2 * from : 2 * to + 1;
}

/// What a message between stages is called in errors and traces: activations travel to the
/// next stage, gradients back.
std::string message_label(std::int64_t from, std::int64_t to, std::int64_t micro_batch) {
  return fmt::format("pipeline {} of micro-batch {}, stage {} -> {}",
                     from < to ? "activation" : "gradient", micro_batch, from, to);
}

}  // namespace

Pipeline::Pipeline(comm::Communicator& pp_group, ScheduleConfig config)
    : group_(pp_group), config_(config), rank_(pp_group.rank()) {
  if (pp_group.size() != config_.ranks) {
    throw InvalidArgument(
        fmt::format("a pipeline of {} ranks on a group of {}", config_.ranks, pp_group.size()));
  }
  actions_ = build_schedule(config_).at(static_cast<std::size_t>(rank_));
  std::vector<comm::PeerLink> links;
  for (std::int64_t s = 0; s + 1 < config_.stages(); ++s) {
    const auto a = static_cast<int>(rank_of(s));
    const auto b = static_cast<int>(rank_of(s + 1));
    if (a == b) continue;  // one rank: handed over in memory
    links.push_back({a, b, link_tag(s, s + 1)});
    links.push_back({b, a, link_tag(s + 1, s)});
  }
  comm::CollectiveOptions options;
  options.label = "pipeline links";
  channels_ = std::make_unique<comm::PeerChannels>(pp_group, std::move(links), options);
}

bool Pipeline::has_last_stage() const {
  return rank_of(config_.stages() - 1) == rank_;
}

void Pipeline::deliver(const Tensor& tensor, std::int64_t from_stage, std::int64_t to_stage,
                       std::int64_t micro_batch) {
  if (rank_of(to_stage) == rank_) {
    local_[{from_stage, to_stage, micro_batch}] = tensor;
    return;
  }
  const Tensor message = tensor.contiguous();
  sends_.push_back(channels_->isend(message, static_cast<int>(rank_of(to_stage)),
                                    link_tag(from_stage, to_stage),
                                    message_label(from_stage, to_stage, micro_batch)));
}

Tensor Pipeline::receive(std::int64_t from_stage, std::int64_t to_stage, std::int64_t micro_batch,
                         const Shape& shape) {
  if (rank_of(from_stage) == rank_) {
    const auto found = local_.find({from_stage, to_stage, micro_batch});
    if (found == local_.end()) {
      throw InvalidArgument(fmt::format("pipeline: stage {} has no output of micro-batch {} yet",
                                        from_stage, micro_batch));
    }
    Tensor tensor = std::move(found->second);
    local_.erase(found);
    return tensor;
  }
  if (posted_ && posted_->key == MessageKey{from_stage, to_stage, micro_batch}) {
    PostedReceive posted = std::move(*posted_);
    posted_.reset();
    posted.work.wait();
    return posted.tensor;
  }
  Tensor tensor(shape, DType::f32);
  channels_->recv(tensor, static_cast<int>(rank_of(from_stage)), link_tag(from_stage, to_stage),
                  message_label(from_stage, to_stage, micro_batch));
  return tensor;
}

std::optional<Pipeline::MessageKey> Pipeline::remote_input(std::size_t index) const {
  const PipelineAction& action = actions_[index];
  const std::int64_t stage = stage_of(config_, rank_, action.chunk);
  const bool forward = action.kind == PipelineAction::Kind::forward;
  const std::int64_t from = forward ? stage - 1 : stage + 1;
  if (from < 0 || from >= config_.stages() || rank_of(from) == rank_) return std::nullopt;
  return MessageKey{from, stage, action.micro_batch};
}

void Pipeline::post_next_receive(std::size_t index, StageWork& work) {
  if (posted_) return;
  for (std::size_t next = index + 1; next < actions_.size(); ++next) {
    const std::optional<MessageKey> key = remote_input(next);
    if (!key) continue;
    const auto [from, to, micro_batch] = *key;
    Tensor tensor(work.boundary_shape(micro_batch), DType::f32);
    comm::Work receiving =
        channels_->irecv(tensor, static_cast<int>(rank_of(from)), link_tag(from, to),
                         message_label(from, to, micro_batch));
    posted_ = PostedReceive{*key, std::move(tensor), std::move(receiving)};
    return;
  }
}

PipelineStepStats Pipeline::run_step(StageWork& work) {
  PipelineStepStats stats;
  const auto start = Clock::now();
  const std::int64_t last_stage = config_.stages() - 1;
  std::map<std::int64_t, Tensor> loss_grads;  // micro-batch -> gradient of the last stage's output
  for (std::size_t index = 0; index < actions_.size(); ++index) {
    const PipelineAction& action = actions_[index];
    const std::int64_t stage = stage_of(config_, rank_, action.chunk);
    const std::int64_t mb = action.micro_batch;
    if (action.kind == PipelineAction::Kind::forward) {
      const auto waiting = Clock::now();
      const Tensor input = stage == 0 ? work.first_input(mb)
                                      : receive(stage - 1, stage, mb, work.boundary_shape(mb));
      const auto computing = Clock::now();
      post_next_receive(index, work);
      Tensor output = work.forward(action.chunk, mb, input);
      if (stage == last_stage) {
        loss_grads[mb] = work.loss_gradient(mb, output);
      } else {
        deliver(output, stage, stage + 1, mb);
      }
      stats.wait_seconds += seconds_between(waiting, computing);
      stats.busy_seconds += seconds_between(computing, Clock::now());
    } else {
      const auto waiting = Clock::now();
      Tensor grad;
      if (stage == last_stage) {
        grad = std::move(loss_grads.at(mb));
        loss_grads.erase(mb);
      } else {
        grad = receive(stage + 1, stage, mb, work.boundary_shape(mb));
      }
      const auto computing = Clock::now();
      post_next_receive(index, work);
      const Tensor grad_input = work.backward(action.chunk, mb, grad);
      if (stage > 0) deliver(grad_input, stage, stage - 1, mb);
      stats.wait_seconds += seconds_between(waiting, computing);
      stats.busy_seconds += seconds_between(computing, Clock::now());
    }
  }
  const auto waiting = Clock::now();
  for (const comm::Work& send : std::exchange(sends_, {}))
    send.wait();
  stats.wait_seconds += seconds_between(waiting, Clock::now());
  stats.seconds = seconds_between(start, Clock::now());
  return stats;
}

Tensor Pipeline::forward_only(StageWork& work) {
  const std::int64_t last_stage = config_.stages() - 1;
  Tensor result;
  for (std::int64_t chunk = 0; chunk < config_.virtual_stages; ++chunk) {
    const std::int64_t stage = stage_of(config_, rank_, chunk);
    const Tensor input =
        stage == 0 ? work.first_input(0) : receive(stage - 1, stage, 0, work.boundary_shape(0));
    Tensor output = work.forward(chunk, 0, input);
    if (stage == last_stage) {
      result = std::move(output);
    } else {
      deliver(output, stage, stage + 1, 0);
    }
  }
  for (const comm::Work& send : std::exchange(sends_, {}))
    send.wait();
  // The last stage's output to every rank: its shape first.
  const auto root = static_cast<int>(rank_of(last_stage));
  comm::CollectiveOptions options;
  options.label = "pipeline output";
  Tensor header = Tensor::zeros(Shape{5}, DType::i64);
  if (rank_ == root) {
    const Tensor whole = result.contiguous();
    result = whole;
    header.values<std::int64_t>()[0] = whole.rank();
    for (int d = 0; d < whole.rank() && d < 4; ++d)
      header.values<std::int64_t>()[static_cast<std::size_t>(d) + 1] = whole.shape()[d];
  }
  group_.broadcast(header, root, options);
  if (rank_ != root) {
    const auto h = header.values<std::int64_t>();
    std::vector<std::int64_t> dims(h.begin() + 1, h.begin() + 1 + h[0]);
    result = Tensor(Shape(dims), DType::f32);
  }
  group_.broadcast(result, root, options);
  return result;
}

}  // namespace meshtensor::pp
