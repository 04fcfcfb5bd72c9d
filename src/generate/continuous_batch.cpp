#include <algorithm>
#include <numeric>

#include <fmt/format.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/core/memory.hpp>
#include <meshtensor/generate/continuous_batch.hpp>
#include <meshtensor/nn/loss.hpp>

namespace meshtensor::generate {

std::vector<std::int64_t> top_classes(std::span<const float> logits, std::int64_t count) {
  std::vector<std::int64_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  const auto keep = static_cast<std::size_t>(
      std::clamp<std::int64_t>(count, 0, static_cast<std::int64_t>(logits.size())));
  std::stable_sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) {
    return logits[static_cast<std::size_t>(a)] > logits[static_cast<std::size_t>(b)];
  });
  order.resize(keep);
  return order;
}

ContinuousBatch::ContinuousBatch(nn::Decoder& model, GeneratorOptions options,
                                 tp::TensorParallel* tp, std::int64_t slots)
    : model_(model), options_(options), tp_(tp) {
  if (slots < 1 || options_.prefill_chunk < 1) {
    throw InvalidArgument(
        fmt::format("continuous batch: slots {} and prefill_chunk {} must be >= 1", slots,
                    options_.prefill_chunk));
  }
  positions_ = options_.cache_positions > 0 ? options_.cache_positions : model_.context();
  if (positions_ > model_.context()) {
    throw InvalidArgument(fmt::format("continuous batch: cache positions {} exceed the context {}",
                                      positions_, model_.context()));
  }
  caches_ = model_.make_caches(slots);
  double bytes = 0;
  for (const nn::KeyValueCache& cache : caches_)
    bytes += static_cast<double>(slots) * cache.slot_bytes(positions_);
  require_memory(bytes, fmt::format("key/value caches for {} sequence(s) of {} positions (fewer "
                                    "requests at once or fewer positions need less)",
                                    slots, positions_));
  for (std::int64_t slot = 0; slot < slots; ++slot)
    for (nn::KeyValueCache& cache : caches_)
      cache.reserve(slot, positions_);
  free_.resize(static_cast<std::size_t>(slots));
  std::iota(free_.rbegin(), free_.rend(), 0);
}

void ContinuousBatch::add(std::uint64_t id, Request request, std::size_t index) {
  check_request(request, index, model_.decoder_spec());
  if (free_.empty()) throw InvalidArgument(fmt::format("request {}: no cache slot is free", index));
  if (std::any_of(running_.begin(), running_.end(), [&](const Running& r) { return r.id == id; }))
    throw InvalidArgument(fmt::format("request {}: id {} is already running", index, id));
  // The slot holds the prompt and the new tokens (the last one drawn is never fed).
  const auto positions =
      static_cast<std::int64_t>(request.prompt.size()) + request.max_new_tokens - 1;
  if (positions > positions_) {
    throw InvalidArgument(fmt::format(
        "request {}: a prompt of {} tokens and {} new tokens need {} positions of key/value "
        "cache; a slot holds {}",
        index, request.prompt.size(), request.max_new_tokens, positions, positions_));
  }
  std::vector<std::int64_t> sequence = request.prompt;
  running_.push_back({id, free_.back(), std::move(request), std::move(sequence), 0, 0});
  free_.pop_back();
}

bool ContinuousBatch::remove(std::uint64_t id) {
  const auto found =
      std::find_if(running_.begin(), running_.end(), [&](const Running& r) { return r.id == id; });
  if (found == running_.end()) return false;
  free_.push_back(found->slot);
  running_.erase(found);
  return true;
}

std::vector<StepEvent> ContinuousBatch::step() {
  if (running_.empty()) return {};
  // Each running request feeds its next tokens (a prompt chunk, or its last token).
  nn::DecodeRows rows;
  std::vector<std::int64_t> ids;
  std::vector<RowToScore> to_score;
  for (std::size_t a = 0; a < running_.size(); ++a) {
    Running& r = running_[a];
    const auto prompt = static_cast<std::int64_t>(r.request.prompt.size());
    const auto pending = static_cast<std::int64_t>(r.sequence.size()) - r.fed;
    const std::int64_t take = std::min(pending, options_.prefill_chunk);
    for (std::int64_t i = 0; i < take; ++i) {
      const std::int64_t position = r.fed + i;
      rows.slots.push_back(r.slot);
      rows.positions.push_back(position);
      ids.push_back(r.sequence[static_cast<std::size_t>(position)]);
      if (r.request.score_prompt && position + 1 < prompt) {
        to_score.push_back({a, rows.size() - 1, r.sequence[static_cast<std::size_t>(position + 1)],
                            r.request.top_logprobs, false});
      }
    }
    r.fed += take;
    if (take == pending) to_score.push_back({a, rows.size() - 1, -1, r.request.top_logprobs, true});
  }
  Tensor tokens(Shape{rows.size()}, DType::i64);
  std::copy(ids.begin(), ids.end(), tokens.values<std::int64_t>().begin());
  if (between_steps_) between_steps_();
  const Tensor logits = model_.decode(tokens, rows, caches_);
  ++stats_.steps;
  stats_.rows += rows.size();
  stats_.largest_batch = std::max(stats_.largest_batch, size());
  const std::vector<ScoredToken> scored = score(logits, to_score);

  std::vector<StepEvent> events(running_.size());
  for (std::size_t a = 0; a < running_.size(); ++a)
    events[a].id = running_[a].id;
  for (std::size_t i = 0; i < to_score.size(); ++i) {
    StepEvent& event = events[to_score[i].running];
    if (!to_score[i].draw) {
      event.prompt.push_back(scored[i]);
      continue;
    }
    Running& r = running_[to_score[i].running];
    event.drawn = scored[i];
    r.sequence.push_back(scored[i].token);
    const std::vector<std::int64_t>& stops = r.request.stop_tokens;
    event.finished = ++r.drawn == r.request.max_new_tokens ||
                     std::find(stops.begin(), stops.end(), scored[i].token) != stops.end();
  }
  for (const StepEvent& event : events)
    if (event.finished) remove(event.id);
  return events;
}

std::vector<ScoredToken> ContinuousBatch::score(const Tensor& logits,
                                                std::vector<RowToScore>& rows) {
  const auto count = static_cast<std::int64_t>(rows.size());
  const std::int64_t local = logits.shape()[1];
  const std::int64_t vocabulary = model_.vocabulary();
  Tensor picked = Tensor::uninitialized(Shape{count, local}, DType::f32);
  for (std::int64_t i = 0; i < count; ++i)
    picked.narrow(0, i, 1).copy_from(logits.narrow(0, rows[static_cast<std::size_t>(i)].row, 1));
  const bool split = tp_ != nullptr && tp_->size() > 1;
  const Tensor whole = split ? tp::gather_classes(*tp_, picked, vocabulary) : picked;
  // Labels: the drawn tokens and the given ones, then each row's most likely tokens.
  std::vector<std::int32_t> labels;
  std::vector<std::vector<std::int64_t>> tops(rows.size());
  std::int64_t extra = 0;
  for (std::int64_t i = 0; i < count; ++i) {
    RowToScore& row = rows[static_cast<std::size_t>(i)];
    const Tensor values = whole.narrow(0, i, 1).contiguous();
    if (row.draw) {
      const Running& r = running_[row.running];
      row.label = sample_token(values.values<float>(), r.request.sampling,
                               static_cast<std::int64_t>(r.sequence.size()));
    }
    labels.push_back(static_cast<std::int32_t>(row.label));
    if (row.top > 0)
      tops[static_cast<std::size_t>(i)] = top_classes(values.values<float>(), row.top);
    extra += static_cast<std::int64_t>(tops[static_cast<std::size_t>(i)].size());
  }
  // The loss the trainer computes on this layout (vocabulary-parallel when split), of every
  // label; a top token is a row of its own, so its score has the same bits as if drawn.
  Tensor scored_rows = picked;
  if (extra > 0) {
    scored_rows = Tensor::uninitialized(Shape{count + extra, local}, DType::f32);
    scored_rows.narrow(0, 0, count).copy_from(picked);
    std::int64_t at = count;
    for (std::int64_t i = 0; i < count; ++i) {
      for (const std::int64_t token : tops[static_cast<std::size_t>(i)]) {
        scored_rows.narrow(0, at++, 1).copy_from(picked.narrow(0, i, 1));
        labels.push_back(static_cast<std::int32_t>(token));
      }
    }
  }
  const nn::CrossEntropyResult result = tp::parallel_cross_entropy(
      scored_rows, labels, split ? tp_ : nullptr, vocabulary, options_.exact_logprobs);
  const auto losses = result.losses.values<double>();
  std::vector<ScoredToken> out(rows.size());
  std::size_t at = rows.size();
  for (std::size_t i = 0; i < rows.size(); ++i) {
    out[i].token = rows[i].label;
    out[i].logprob = -losses[i];
    for (const std::int64_t token : tops[i])
      out[i].top.emplace_back(token, -losses[at++]);
  }
  return out;
}

}  // namespace meshtensor::generate
