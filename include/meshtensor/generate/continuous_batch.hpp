#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <utility>
#include <vector>

#include <meshtensor/generate/generator.hpp>

namespace meshtensor::generate {

/// A token and its log-probability under the model (the trainer's bits), with the most likely
/// tokens of its position when asked for (Request::top_logprobs).
struct ScoredToken {
  std::int64_t token = 0;
  double logprob = 0;
  /// The top_logprobs most likely tokens of the position, most likely first (ties: lower id
  /// first), each scored as `logprob` is.
  std::vector<std::pair<std::int64_t, double>> top;
};

/// What one step did for one running request.
struct StepEvent {
  std::uint64_t id = 0;
  /// Scores of the prompt tokens fed this step, when the request asked (Request::score_prompt);
  /// the prompt's first token has none, so the i-th score is prompt token i + 1's.
  std::vector<ScoredToken> prompt;
  std::optional<ScoredToken> drawn;  ///< the token drawn this step, if its prompt is all in
  bool finished = false;  ///< max_new_tokens reached or a stop token drawn: the request left
};

/// The engine under Generator, one decode step at a time, for callers whose requests arrive and
/// leave while others run (a server): requests are added and removed between steps, and each
/// step() runs Decoder::decode once on the next rows of every running request. Every row has the
/// bits the trainer's forward gives its position, and sampling depends on the request alone, so
/// what a request gets never depends on when it was added or what else runs. With a tensor-parallel
/// group, every member makes the same calls in the same order.
class ContinuousBatch {
 public:
  /// Over `model` (which must outlive it) with `slots` cache slots (at most `slots` requests
  /// running) of options.cache_positions positions each, reserved now. `tp` as for Generator.
  /// InvalidArgument for slots or prefill_chunk below 1 or cache positions past the context;
  /// ResourceError naming the caches when they do not fit in memory.
  ContinuousBatch(nn::Decoder& model, GeneratorOptions options, tp::TensorParallel* tp,
                  std::int64_t slots);
  /// Requests running now.
  std::int64_t size() const { return static_cast<std::int64_t>(running_.size()); }
  /// Positions a slot holds.
  std::int64_t cache_positions() const { return positions_; }
  /// Slots free for add().
  std::int64_t free_slots() const { return static_cast<std::int64_t>(free_.size()); }
  /// Starts `request` under `id`. InvalidArgument when no slot is free, `id` is running, or the
  /// request cannot run on the model (check_request) or in a slot (its prompt and new tokens
  /// past the cache's positions; `index` names it in the message).
  void add(std::uint64_t id, Request request, std::size_t index = 0);
  /// Stops request `id` and frees its slot; false when it is not running.
  bool remove(std::uint64_t id);
  /// One decode step over every running request (none running: nothing happens). Requests that
  /// drew their last token leave the batch.
  std::vector<StepEvent> step();
  /// Calls `check` before every decode step (see Generator::check_between_steps).
  void check_between_steps(std::function<void()> check) { between_steps_ = std::move(check); }
  /// Figures since construction.
  const GeneratorStats& stats() const { return stats_; }

 private:
  struct Running {
    std::uint64_t id;
    std::int64_t slot;
    Request request;
    std::vector<std::int64_t> sequence;
    std::int64_t fed = 0;
    std::int64_t drawn = 0;
  };
  /// A row of this step's logits to score: drawn (label chosen by sampling) or a prompt token.
  struct RowToScore {
    std::size_t running;
    std::int64_t row;
    std::int64_t label;  ///< the token scored; set by score() when drawn
    std::int64_t top;
    bool draw;  ///< sample the label
  };
  std::vector<ScoredToken> score(const Tensor& logits, std::vector<RowToScore>& rows);

  nn::Decoder& model_;
  GeneratorOptions options_;
  tp::TensorParallel* tp_;
  std::vector<nn::KeyValueCache> caches_;
  std::vector<std::int64_t> free_;
  std::int64_t positions_ = 0;
  std::vector<Running> running_;
  GeneratorStats stats_;
  std::function<void()> between_steps_;
};

/// The `count` most likely classes of a row of whole logits, most likely first (ties: the lower
/// index first).
std::vector<std::int64_t> top_classes(std::span<const float> logits, std::int64_t count);

}  // namespace meshtensor::generate
