#include <algorithm>
#include <cmath>
#include <numeric>

#include <fmt/format.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/core/random.hpp>
#include <meshtensor/generate/generator.hpp>
#include <meshtensor/nn/loss.hpp>

namespace meshtensor::generate {

namespace {

/// A running request: its cache slot, its tokens so far and how many the cache holds.
struct Running {
  std::size_t index;
  std::int64_t slot;
  std::vector<std::int64_t> sequence;
  std::int64_t fed = 0;
};

}  // namespace

void check_request(const Request& request, std::size_t index, const nn::GptConfig& config) {
  const auto bad = [&](const std::string& what) {
    return InvalidArgument(fmt::format("request {}: {}", index, what));
  };
  if (request.prompt.empty()) throw bad("the prompt is empty (give at least one token)");
  for (std::size_t i = 0; i < request.prompt.size(); ++i) {
    const std::int64_t token = request.prompt[i];
    if (token < 0 || token >= config.vocabulary) {
      throw bad(fmt::format("token {} at prompt position {} is outside the vocabulary of {}", token,
                            i, config.vocabulary));
    }
  }
  if (request.max_new_tokens < 1)
    throw bad(fmt::format("max_new_tokens {} is below 1", request.max_new_tokens));
  const auto length = static_cast<std::int64_t>(request.prompt.size());
  if (length + request.max_new_tokens > config.context) {
    throw bad(fmt::format(
        "a prompt of {} tokens plus {} new tokens is longer than the model's context of {}", length,
        request.max_new_tokens, config.context));
  }
  const Sampling& s = request.sampling;
  if (!std::isfinite(s.temperature) || s.temperature < 0)
    throw bad(fmt::format("temperature {} is not a finite value >= 0", s.temperature));
  if (s.top_k < 0) throw bad(fmt::format("top_k {} is negative", s.top_k));
}

std::vector<std::int64_t> byte_tokens(std::string_view text) {
  std::vector<std::int64_t> tokens;
  for (const char c : text)
    tokens.push_back(static_cast<unsigned char>(c));
  return tokens;
}

std::string token_bytes(std::span<const std::int64_t> tokens) {
  std::string bytes;
  for (const std::int64_t t : tokens)
    bytes.push_back(static_cast<char>(t));
  return bytes;
}

std::int64_t sample_token(std::span<const float> logits, const Sampling& sampling,
                          std::int64_t position) {
  const auto n = static_cast<std::int64_t>(logits.size());
  if (n == 0) throw InvalidArgument("sample_token: no logits");
  const auto first_largest = [&] {
    return std::max_element(logits.begin(), logits.end()) - logits.begin();
  };
  if (sampling.temperature == 0) return first_largest();
  // The top_k largest logits (ties: the lower index first), in index order.
  std::vector<std::int64_t> order(static_cast<std::size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  const std::int64_t keep = sampling.top_k > 0 ? std::min(sampling.top_k, n) : n;
  std::stable_sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) {
    return logits[static_cast<std::size_t>(a)] > logits[static_cast<std::size_t>(b)];
  });
  order.resize(static_cast<std::size_t>(keep));
  std::sort(order.begin(), order.end());
  const double top = logits[static_cast<std::size_t>(first_largest())];
  std::vector<double> weights;
  double total = 0;
  for (const std::int64_t i : order) {
    weights.push_back(std::exp((static_cast<double>(logits[static_cast<std::size_t>(i)]) - top) /
                               sampling.temperature));
    total += weights.back();
  }
  const std::uint64_t bits = mix64(mix64(sampling.seed) ^ static_cast<std::uint64_t>(position));
  const double target = static_cast<double>(bits >> 11) * 0x1.0p-53 * total;
  double cumulative = 0;
  for (std::size_t k = 0; k < order.size(); ++k) {
    cumulative += weights[k];
    if (target < cumulative) return order[k];
  }
  return order.back();
}

Generator::Generator(nn::Gpt& model, GeneratorOptions options, tp::TensorParallel* tp)
    : model_(model), options_(options), tp_(tp) {
  if (options_.max_batch < 1 || options_.prefill_chunk < 1) {
    throw InvalidArgument(fmt::format("generator: max_batch {} and prefill_chunk {} must be >= 1",
                                      options_.max_batch, options_.prefill_chunk));
  }
}

std::vector<Completion> Generator::generate(const std::vector<Request>& requests) {
  for (std::size_t i = 0; i < requests.size(); ++i)
    check_request(requests[i], i, model_.config());
  stats_ = {};
  std::vector<Completion> done(requests.size());
  const std::int64_t slots =
      std::min<std::int64_t>(options_.max_batch, std::max<std::size_t>(requests.size(), 1));
  std::vector<nn::KeyValueCache> caches = model_.make_caches(slots);
  std::vector<std::int64_t> free_slots(static_cast<std::size_t>(slots));
  std::iota(free_slots.rbegin(), free_slots.rend(), 0);
  std::vector<Running> running;
  std::size_t next = 0;
  while (next < requests.size() || !running.empty()) {
    while (next < requests.size() && !free_slots.empty()) {
      running.push_back({next, free_slots.back(), requests[next].prompt, 0});
      free_slots.pop_back();
      ++next;
    }
    // Each running request feeds its next tokens (a prompt chunk, or its last token).
    nn::DecodeRows rows;
    std::vector<std::int64_t> ids;
    std::vector<std::int64_t> last_row(running.size(), -1);
    for (std::size_t a = 0; a < running.size(); ++a) {
      Running& r = running[a];
      const auto pending = static_cast<std::int64_t>(r.sequence.size()) - r.fed;
      const std::int64_t take = std::min(pending, options_.prefill_chunk);
      for (std::int64_t i = 0; i < take; ++i) {
        rows.slots.push_back(r.slot);
        rows.positions.push_back(r.fed + i);
        ids.push_back(r.sequence[static_cast<std::size_t>(r.fed + i)]);
      }
      r.fed += take;
      if (take == pending) last_row[a] = rows.size() - 1;
    }
    Tensor tokens(Shape{rows.size()}, DType::i64);
    std::copy(ids.begin(), ids.end(), tokens.values<std::int64_t>().begin());
    if (between_steps_) between_steps_();
    const Tensor logits = model_.decode(tokens, rows, caches);
    ++stats_.steps;
    stats_.rows += rows.size();
    stats_.largest_batch =
        std::max<std::int64_t>(stats_.largest_batch, static_cast<std::int64_t>(running.size()));
    // Requests whose whole sequence is in the cache draw their next token.
    std::vector<std::int64_t> ready_rows;
    std::vector<const Request*> ready_requests;
    std::vector<std::int64_t> positions;
    for (std::size_t a = 0; a < running.size(); ++a) {
      if (last_row[a] < 0) continue;
      ready_rows.push_back(last_row[a]);
      ready_requests.push_back(&requests[running[a].index]);
      positions.push_back(static_cast<std::int64_t>(running[a].sequence.size()));
    }
    std::vector<std::int64_t> drawn;
    std::vector<double> logprobs;
    draw(logits, ready_rows, ready_requests, positions, drawn, logprobs);
    std::vector<Running> still;
    std::size_t next_drawn = 0;
    for (std::size_t a = 0; a < running.size(); ++a) {
      Running& r = running[a];
      if (last_row[a] < 0) {
        still.push_back(std::move(r));
        continue;
      }
      const Request& request = requests[r.index];
      const std::int64_t token = drawn[next_drawn];
      Completion& c = done[r.index];
      c.tokens.push_back(token);
      c.logprobs.push_back(logprobs[next_drawn++]);
      r.sequence.push_back(token);
      if (static_cast<std::int64_t>(c.tokens.size()) == request.max_new_tokens) {
        free_slots.push_back(r.slot);
      } else {
        still.push_back(std::move(r));
      }
    }
    running = std::move(still);
  }
  return done;
}

void Generator::draw(const Tensor& logits, std::span<const std::int64_t> rows,
                     std::span<const Request* const> requests,
                     std::span<const std::int64_t> positions, std::vector<std::int64_t>& tokens,
                     std::vector<double>& logprobs) {
  const auto count = static_cast<std::int64_t>(rows.size());
  const std::int64_t local = logits.shape()[1];
  const std::int64_t vocabulary = model_.config().vocabulary;
  Tensor ready = Tensor::uninitialized(Shape{count, local}, DType::f32);
  for (std::int64_t i = 0; i < count; ++i)
    ready.narrow(0, i, 1).copy_from(logits.narrow(0, rows[static_cast<std::size_t>(i)], 1));
  const bool split = tp_ != nullptr && tp_->size() > 1;
  const Tensor whole = split ? tp::gather_classes(*tp_, ready, vocabulary) : ready;
  std::vector<std::int32_t> labels;
  for (std::int64_t i = 0; i < count; ++i) {
    const auto at = static_cast<std::size_t>(i);
    const Tensor row = whole.narrow(0, i, 1).contiguous();
    tokens.push_back(sample_token(row.values<float>(), requests[at]->sampling, positions[at]));
    labels.push_back(static_cast<std::int32_t>(tokens.back()));
  }
  // The loss the trainer computes on this layout: vocabulary-parallel when split.
  const nn::CrossEntropyResult scored = tp::parallel_cross_entropy(
      ready, labels, split ? tp_ : nullptr, vocabulary, options_.exact_logprobs);
  for (const double loss : scored.losses.values<double>())
    logprobs.push_back(-loss);
}

}  // namespace meshtensor::generate
