#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <meshtensor/core/tensor.hpp>
#include <meshtensor/nn/models.hpp>
#include <meshtensor/tokenize/chat_format.hpp>
#include <meshtensor/tokenize/tokenizer.hpp>
#include <meshtensor/tp/tensor_parallel.hpp>

namespace meshtensor::generate {

/// How a request picks its tokens. temperature 0: greedy (the first largest logit); otherwise a
/// draw from softmax(logits / temperature) over the top_k largest logits (0: all), narrowed to
/// the fewest most likely of them whose probabilities (at that temperature) add up to top_p at
/// least (nucleus sampling; 1: all), with one uniform number made from (seed, the position of
/// the token drawn) alone, so a request's tokens never depend on what else is being generated.
struct Sampling {
  double temperature = 0.0;
  std::int64_t top_k = 0;
  std::uint64_t seed = 0;
  double top_p = 1.0;
};

/// One prompt and how to continue it.
struct Request {
  std::vector<std::int64_t> prompt;  ///< token ids, at least one
  std::int64_t max_new_tokens = 16;  ///< tokens to generate, at least one
  Sampling sampling;
  bool score_prompt = false;      ///< also score the prompt's tokens (ContinuousBatch)
  std::int64_t top_logprobs = 0;  ///< the most likely tokens reported with each score
  /// The request ends once it draws one of these (kept as its last token): the tokenizer's end
  /// ids (SpecialRoles::end_ids).
  std::vector<std::int64_t> stop_tokens = {};
};

/// What a request produced: each generated token and its log-probability under the model
/// (log softmax of the logits at temperature 1, computed as the trainer's loss computes it);
/// max_new_tokens of them, or fewer ending in a stop token.
struct Completion {
  std::vector<std::int64_t> tokens;
  std::vector<double> logprobs;
};

/// How the generator batches.
struct GeneratorOptions {
  std::int64_t max_batch = 16;      ///< requests decoded together (cache slots)
  std::int64_t prefill_chunk = 64;  ///< prompt tokens a request feeds per step
  /// Exact softmax denominators in the log-probabilities (exact mode; the model's own exact
  /// sums are set on the model).
  bool exact_logprobs = false;
  /// Positions each cache slot holds, reserved up front (0: the model's context): a request's
  /// prompt and new tokens must fit. A model of a long context (Qwen3's 40,960) serves shorter
  /// requests in the memory they need.
  std::int64_t cache_positions = 0;
};

/// Figures of the last generate() call.
struct GeneratorStats {
  std::int64_t steps = 0;          ///< decode calls
  std::int64_t rows = 0;           ///< rows (positions) computed over all calls
  std::int64_t largest_batch = 0;  ///< most requests in one call
};

/// InvalidArgument naming request `index` and the value unless `request` can run on a model of
/// `config`: a non-empty prompt inside the vocabulary, at least one new token, prompt plus new
/// tokens within the context, a finite temperature >= 0, top_k >= 0, top_p in [0, 1],
/// top_logprobs from 0 to the vocabulary and stop tokens inside it. generate() checks every request
/// with it before generating anything.
void check_request(const Request& request, std::size_t index, const nn::DecoderSpec& config);

/// Generates with continuous batching over a decoder (any family): requests join the running batch
/// as slots free up and leave when done; prompts are fed in chunks; each step runs Decoder::decode
/// on the rows of every running request. Every row has the bits the trainer's forward gives that
/// position of its sequence, and sampling depends on the request alone, so a request's tokens and
/// log-probabilities are the same bits alone or in any batch, at any chunk size.
class Generator {
 public:
  /// Over `model` (which must outlive the generator). With `tp`, the model is split over that
  /// tensor-parallel group (tp::parallelize_module with tp::decoder_plan(.., false)); every member
  /// calls generate() with the same requests, gets the whole logits for sampling and computes the
  /// log-probabilities with the vocabulary-parallel loss, as the trainer does on that layout.
  /// InvalidArgument for a max_batch or prefill_chunk below 1.
  Generator(nn::Decoder& model, GeneratorOptions options, tp::TensorParallel* tp = nullptr);
  /// The completions of `requests`, in their order. InvalidArgument naming the request and the
  /// value for an empty prompt, a token outside the vocabulary, a prompt plus max_new_tokens
  /// longer than the context, or a bad sampling setting; nothing is generated then.
  std::vector<Completion> generate(const std::vector<Request>& requests);
  /// Figures of the last generate() call.
  const GeneratorStats& stats() const { return stats_; }
  /// Calls `check` before every decode step; it throws to stop generating (e.g.
  /// Communicator::throw_if_aborted, so that an interrupt stops a long generation at once).
  void check_between_steps(std::function<void()> check) { between_steps_ = std::move(check); }

 private:
  nn::Decoder& model_;
  GeneratorOptions options_;
  tp::TensorParallel* tp_;
  GeneratorStats stats_;
  std::function<void()> between_steps_;
};

/// The request of a text prompt: its ids with the tokenizer's special tokens around them (a bos
/// first, as Hugging Face's encode() puts it), ending at the tokenizer's end ids.
Request text_request(const tokenize::Tokenizer& tokenizer, std::string_view prompt,
                     std::int64_t max_new_tokens, const Sampling& sampling);

/// How text prompts become requests: plain, as text_request() makes them; or as a chat, each
/// prompt one user message (after a system message when one is given) rendered by the chat
/// format with the assistant's turn opened, ending at the tokenizer's end ids.
struct PromptFormat {
  std::shared_ptr<const tokenize::Tokenizer> tokenizer;
  std::shared_ptr<const tokenize::ChatFormat> chat;  ///< null: plain text prompts
  std::string system;                                ///< the chat's system message (empty: none)
  /// The request of `prompt`. DataError when the chat template raises an exception.
  Request request(std::string_view prompt, std::int64_t max_new_tokens,
                  const Sampling& sampling) const;
};

/// The prompt format of a model reading tokens of `tokenizer`: plain unless `chat`; a chat
/// renders `template_path`'s template when given (a file of at most 1 MiB), else the
/// tokenizer's own. ParseError naming the file or the construct the renderer refuses, or
/// saying the model has no template.
PromptFormat prompt_format(std::shared_ptr<const tokenize::Tokenizer> tokenizer, bool chat,
                           const std::string& template_path, std::string system);

/// The completion's tokens without a stop token that ended it: what its text is made of.
std::span<const std::int64_t> text_tokens(const Completion& completion, const Request& request);

/// The token `sampling` picks from a row of logits for `position` (see Sampling).
std::int64_t sample_token(std::span<const float> logits, const Sampling& sampling,
                          std::int64_t position);

/// The byte-level tokens of `text` (its bytes, 0 to 255), as the trainer tokenises text.
std::vector<std::int64_t> byte_tokens(std::string_view text);
/// The bytes of byte-level tokens (each 0 to 255).
std::string token_bytes(std::span<const std::int64_t> tokens);

}  // namespace meshtensor::generate
