#include <algorithm>
#include <cmath>
#include <numeric>

#include <fmt/format.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/core/file.hpp>
#include <meshtensor/core/random.hpp>
#include <meshtensor/generate/continuous_batch.hpp>
#include <meshtensor/generate/generator.hpp>
#include <meshtensor/kernels/portable_math.hpp>

namespace meshtensor::generate {

void check_request(const Request& request, std::size_t index, const nn::DecoderSpec& model) {
  const std::int64_t vocabulary = model.vocabulary;
  const std::int64_t context = model.context;
  const auto bad = [&](const std::string& what) {
    return InvalidArgument(fmt::format("request {}: {}", index, what));
  };
  if (request.prompt.empty()) throw bad("the prompt is empty (give at least one token)");
  for (std::size_t i = 0; i < request.prompt.size(); ++i) {
    const std::int64_t token = request.prompt[i];
    if (token < 0 || token >= vocabulary) {
      throw bad(fmt::format("token {} at prompt position {} is outside the vocabulary of {}", token,
                            i, vocabulary));
    }
  }
  if (request.max_new_tokens < 1)
    throw bad(fmt::format("max_new_tokens {} is below 1", request.max_new_tokens));
  const auto length = static_cast<std::int64_t>(request.prompt.size());
  if (length + request.max_new_tokens > context) {
    throw bad(fmt::format(
        "a prompt of {} tokens plus {} new tokens is longer than the model's context of {}", length,
        request.max_new_tokens, context));
  }
  const Sampling& s = request.sampling;
  if (!std::isfinite(s.temperature) || s.temperature < 0)
    throw bad(fmt::format("temperature {} is not a finite value >= 0", s.temperature));
  if (s.top_k < 0) throw bad(fmt::format("top_k {} is negative", s.top_k));
  if (!(s.top_p >= 0 && s.top_p <= 1)) throw bad(fmt::format("top_p {} is not in [0, 1]", s.top_p));
  if (request.top_logprobs < 0 || request.top_logprobs > vocabulary) {
    throw bad(fmt::format("top_logprobs {} is not between 0 and the vocabulary of {}",
                          request.top_logprobs, vocabulary));
  }
  for (const std::int64_t token : request.stop_tokens) {
    if (token < 0 || token >= vocabulary)
      throw bad(fmt::format("stop token {} is outside the vocabulary of {}", token, vocabulary));
  }
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
  const double top = logits[static_cast<std::size_t>(first_largest())];
  const auto weight = [&](std::int64_t i) {
    return kernels::exp_f64((static_cast<double>(logits[static_cast<std::size_t>(i)]) - top) /
                            sampling.temperature);
  };
  if (sampling.top_p < 1) {
    // The fewest most likely classes whose probabilities add up to top_p.
    double mass = 0;
    for (const std::int64_t i : order)
      mass += weight(i);
    double kept = 0;
    std::size_t count = 0;
    while (count < order.size() && kept < sampling.top_p * mass)
      kept += weight(order[count++]);
    order.resize(std::max<std::size_t>(count, 1));
  }
  std::sort(order.begin(), order.end());
  std::vector<double> weights;
  double total = 0;
  for (const std::int64_t i : order) {
    weights.push_back(weight(i));
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

Generator::Generator(nn::Decoder& model, GeneratorOptions options, tp::TensorParallel* tp)
    : model_(model), options_(options), tp_(tp) {
  if (options_.max_batch < 1 || options_.prefill_chunk < 1) {
    throw InvalidArgument(fmt::format("generator: max_batch {} and prefill_chunk {} must be >= 1",
                                      options_.max_batch, options_.prefill_chunk));
  }
}

std::vector<Completion> Generator::generate(const std::vector<Request>& requests) {
  const nn::DecoderSpec config = model_.decoder_spec();
  for (std::size_t i = 0; i < requests.size(); ++i)
    check_request(requests[i], i, config);
  const std::int64_t slots =
      std::min<std::int64_t>(options_.max_batch, std::max<std::size_t>(requests.size(), 1));
  // Slots as long as the longest request needs (unless the options say), not the whole context.
  GeneratorOptions options = options_;
  if (options.cache_positions == 0) {
    for (const Request& r : requests) {
      options.cache_positions =
          std::max(options.cache_positions,
                   static_cast<std::int64_t>(r.prompt.size()) + r.max_new_tokens - 1);
    }
    options.cache_positions =
        std::clamp<std::int64_t>(options.cache_positions, 1, model_.context());
  }
  ContinuousBatch batch(model_, options, tp_, slots);
  batch.check_between_steps(between_steps_);
  std::vector<Completion> done(requests.size());
  std::size_t next = 0;
  while (next < requests.size() || batch.size() > 0) {
    for (; next < requests.size() && batch.free_slots() > 0; ++next)
      batch.add(next, requests[next], next);
    for (const StepEvent& event : batch.step()) {
      if (!event.drawn) continue;
      Completion& c = done[event.id];
      c.tokens.push_back(event.drawn->token);
      c.logprobs.push_back(event.drawn->logprob);
    }
  }
  stats_ = batch.stats();
  return done;
}

Request text_request(const tokenize::Tokenizer& tokenizer, std::string_view prompt,
                     std::int64_t max_new_tokens, const Sampling& sampling) {
  Request request{tokenizer.encode_with_specials(prompt), max_new_tokens, sampling};
  request.stop_tokens = tokenizer.roles().end_ids;
  return request;
}

Request PromptFormat::request(std::string_view prompt, std::int64_t max_new_tokens,
                              const Sampling& sampling) const {
  if (!chat) return text_request(*tokenizer, prompt, max_new_tokens, sampling);
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  if (!system.empty()) messages.push_back({{"role", "system"}, {"content", system}});
  messages.push_back({{"role", "user"}, {"content", std::string(prompt)}});
  Request request{chat->encode(messages, {}), max_new_tokens, sampling};
  request.stop_tokens = tokenizer->roles().end_ids;
  return request;
}

PromptFormat prompt_format(std::shared_ptr<const tokenize::Tokenizer> tokenizer, bool chat,
                           const std::string& template_path, std::string system) {
  PromptFormat format{tokenizer, nullptr, std::move(system)};
  if (!chat) {
    if (!template_path.empty() || !format.system.empty())
      throw ParseError("--chat-template and --system shape a chat: give --chat with them");
    return format;
  }
  if (template_path.empty()) {
    format.chat = std::make_shared<const tokenize::ChatFormat>(std::move(tokenizer));
  } else {
    format.chat = std::make_shared<const tokenize::ChatFormat>(
        std::move(tokenizer),
        read_regular_file(template_path, std::int64_t{1} << 20, "a chat template"), template_path);
  }
  return format;
}

std::span<const std::int64_t> text_tokens(const Completion& completion, const Request& request) {
  std::span<const std::int64_t> tokens = completion.tokens;
  const std::vector<std::int64_t>& stops = request.stop_tokens;
  if (!tokens.empty() && std::find(stops.begin(), stops.end(), tokens.back()) != stops.end())
    tokens = tokens.first(tokens.size() - 1);
  return tokens;
}

}  // namespace meshtensor::generate
