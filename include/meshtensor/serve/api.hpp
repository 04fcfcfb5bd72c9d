#pragma once

// The OpenAI completions API as the server speaks it: requests parsed and checked at the edge
// (every field's type and range, against the served model), OpenAI-shaped responses, stream
// chunks and error objects. No I/O and no threads here.

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include <meshtensor/generate/continuous_batch.hpp>
#include <meshtensor/nn/models.hpp>
#include <meshtensor/tokenize/chat_format.hpp>
#include <meshtensor/tokenize/tokenizer.hpp>

namespace meshtensor::serve {

/// Response JSON keeps its fields in the order they are set, as OpenAI's do.
using Json = nlohmann::ordered_json;

/// An OpenAI-style error: the HTTP status and the body's error object.
struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";  ///< OpenAI's error types
  std::string param;                           ///< the request field at fault (empty: none)
  std::string code;                            ///< e.g. model_not_found (empty: null)
};

/// The body of an error response: {"error": {"message", "type", "param", "code"}}.
Json error_body(const ApiError& error);

/// What the server accepts, checked before anything is allocated for a request.
struct ApiLimits {
  std::int64_t max_body_bytes = std::int64_t{1} << 20;  ///< larger bodies: 413
  std::int64_t max_choices = 64;                        ///< prompts × n in one request
  std::int64_t max_stop = 4;                            ///< stop sequences
  std::int64_t max_stop_bytes = 64;                     ///< bytes of one stop sequence
  std::int64_t max_top_logprobs = 20;                   ///< the largest `logprobs`
};

/// A completions request, checked.
struct CompletionParams {
  std::vector<std::vector<std::int64_t>> prompts;  ///< token ids, one list per prompt
  /// The served model's tokenizer: it encoded the text prompts, and decodes what is generated.
  std::shared_ptr<const tokenize::Tokenizer> tokenizer = tokenize::byte_tokenizer();
  std::int64_t max_tokens = 16;
  generate::Sampling sampling;  ///< seed: choice 0's (choice j draws with seed + j)
  bool seed_given = false;
  std::int64_t n = 1;
  std::vector<std::string> stop;
  std::optional<std::int64_t> logprobs;  ///< null: none; k: the chosen token's and the top k
  bool echo = false;
  bool stream = false;
  bool include_usage = false;  ///< stream_options.include_usage
  /// A /v1/chat/completions request: chat.completion objects, the assistant's message (a
  /// stream's deltas, the role first) and logprobs.content; one prompt, the rendered messages.
  bool chat = false;
};

/// Parses and checks a POST /v1/completions body for `model_name`, a decoder of `config` reading
/// tokens of `tokenizer` (text prompts are encoded by it; token-id prompts are its ids): ApiError
/// naming the field and the value for malformed JSON, a wrong type, an unknown field (rejected,
/// as OpenAI does), a value out of range, a prompt past the context or a limit passed; 404
/// (model_not_found) for another model. `default_seed` is used when the request has none.
CompletionParams parse_completion_request(std::string_view body, const std::string& model_name,
                                          const nn::DecoderSpec& config,
                                          std::shared_ptr<const tokenize::Tokenizer> tokenizer,
                                          const ApiLimits& limits, std::uint64_t default_seed);

/// What the served model offers for chat: its chat format, or why it has none (a model without
/// a template, or one using a construct the renderer refuses).
struct ChatSupport {
  std::shared_ptr<const tokenize::ChatFormat> format;
  std::string missing;  ///< why `format` is null
};

/// The chat support of a model reading tokens of `tokenizer` (its chat template's).
ChatSupport chat_support(std::shared_ptr<const tokenize::Tokenizer> tokenizer);

/// Parses and checks a POST /v1/chat/completions body as parse_completion_request() does, the
/// messages rendered by `chat`'s template with add_generation_prompt (default true) and
/// chat_template_kwargs, encoded without added specials (the template writes them):
/// max_tokens or max_completion_tokens (default: the rest of the context), logprobs (a bool)
/// with top_logprobs; 400 naming the field for a message not well formed or a template that
/// raises an exception; 400 (chat_template_missing) when the model has no usable template.
CompletionParams parse_chat_request(std::string_view body, const std::string& model_name,
                                    const nn::DecoderSpec& config, const ChatSupport& chat,
                                    const ApiLimits& limits, std::uint64_t default_seed);

/// One choice as generated so far: the prompt, its scores (echo with logprobs) and its tokens.
struct ChoiceResult {
  std::vector<std::int64_t> prompt;
  std::vector<generate::ScoredToken> prompt_scores;  ///< prompt tokens 1.. (echo + logprobs)
  std::vector<generate::ScoredToken> tokens;         ///< generated, cut at a stop sequence
  /// Bytes of the generated text kept when a stop sequence ended the choice (the text before
  /// it, which may end inside the last kept token); none: the text of all `tokens`.
  std::optional<std::size_t> text_bytes;
  std::string finish_reason;  ///< "stop", "length" (empty: running)
};

/// Where a stop sequence cut a choice.
struct StopCut {
  std::size_t tokens = 0;      ///< generated tokens kept: those with a byte before the sequence
  std::size_t text_bytes = 0;  ///< bytes of generated text kept: those before the sequence
  bool operator==(const StopCut&) const = default;
};

/// How a stop sequence ends a choice whose last token was just drawn: when the generated text
/// (the bytes of `tokens` by `tokenizer`) now holds one of `stop` ending in the last token's
/// bytes, the cut before its first occurrence; else nothing.
std::optional<StopCut> stop_cut(std::span<const generate::ScoredToken> tokens,
                                const std::vector<std::string>& stop,
                                const tokenize::Tokenizer& tokenizer);

/// Generated tokens [0, n) of a running choice that a stream may send now: whole tokens whose
/// text does not end with bytes that could still become a stop sequence, nor with an unfinished
/// UTF-8 character.
std::size_t streamable_tokens(std::span<const generate::ScoredToken> tokens,
                              const std::vector<std::string>& stop,
                              const tokenize::Tokenizer& tokenizer);

/// Identity of a response: its id, creation time, model and the weights that produced it.
struct ResponseHeader {
  std::string id;
  std::int64_t created = 0;
  std::string model;
  std::int64_t weights_step = 0;
  std::uint64_t seed = 0;
};

/// The whole response to a non-streamed request.
Json completion_response(const ResponseHeader& header, const CompletionParams& params,
                         const std::vector<ChoiceResult>& choices);

/// One stream chunk of choice `index`: generated tokens [from, to) (with the prompt first when
/// `with_prompt`), and the finish reason when the choice ended.
Json completion_chunk(const ResponseHeader& header, const CompletionParams& params,
                      std::size_t index, const ChoiceResult& choice, std::size_t from,
                      std::size_t to, bool with_prompt, bool finished);

/// Stream chunks as text, the response's fixed fields rendered once: chunk() is
/// dump(completion_chunk(...)) at a fraction of the cost, for the tokens of a busy stream.
class ChunkWriter {
 public:
  explicit ChunkWriter(const ResponseHeader& header, bool chat = false);
  std::string chunk(const CompletionParams& params, std::size_t index, const ChoiceResult& choice,
                    std::size_t from, std::size_t to, bool with_prompt, bool finished) const;

 private:
  std::string prefix_;
  std::string suffix_;
};

/// The "object" of a response: chat.completion[.chunk] for chat, else text_completion.
const char* response_object(bool chat, bool chunk);

/// The usage object: prompt, completion and total tokens of `choices`.
Json usage(const CompletionParams& params, const std::vector<ChoiceResult>& choices);

/// `value` as JSON text; bytes that are not UTF-8 become U+FFFD (generated text is bytes).
std::string dump(const Json& value);

}  // namespace meshtensor::serve
