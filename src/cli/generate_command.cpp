#include <algorithm>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <meshtensor/checkpoint/checkpoint.hpp>
#include <meshtensor/comm/agree.hpp>
#include <meshtensor/comm/communicator.hpp>
#include <meshtensor/core/error.hpp>
#include <meshtensor/generate/generator.hpp>
#include <meshtensor/generate/load.hpp>
#include <meshtensor/generate/prompt_source.hpp>
#include <meshtensor/kernels/simd.hpp>
#include <meshtensor/tp/style.hpp>
#include <meshtensor/train/text_data.hpp>

#include "backend.hpp"
#include "commands.hpp"
#include "generate_bench.hpp"
#include "options.hpp"
#include "timing.hpp"

namespace meshtensor::cli {

namespace {

struct GenerateOptions {
  std::string checkpoint;
  std::string prompt;
  std::string prompts;
  std::string max_new_tokens = "64";
  std::string temperature = "0.8";
  std::string top_k = "0";
  std::string seed = "0";
  std::string mode = "ordered";
  std::string max_batch = "16";
  std::string prefill_chunk = "64";
  std::string ranks;
  std::string mesh;
  std::string names;
  std::string backend = "threads";
  std::string chat_template;
  std::string system;
  bool json = false;
  bool chat = false;
  CLI::Option* prompt_option = nullptr;
  CLI::Option* prompts_option = nullptr;
};

/// The prompts --prompt or --prompts give.
generate::PromptSource prompt_source(const GenerateOptions& options) {
  const auto given = [](const CLI::Option* option, const std::string& value) {
    return option->count() > 0 ? std::optional<std::string>(value) : std::nullopt;
  };
  return {given(options.prompt_option, options.prompt),
          given(options.prompts_option, options.prompts)};
}

/// Each completion: its text (without the stop token that ended it), tokens and scores.
void print_completions(const std::vector<std::string>& prompts,
                       const std::vector<generate::Request>& requests,
                       const std::vector<generate::Completion>& completions,
                       const tokenize::Tokenizer& tokenizer, bool json, std::size_t first) {
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    const generate::Completion& c = completions[i];
    const auto shown = generate::text_tokens(c, requests[i]);
    const std::string text = train::printable_text(tokenizer.decode(shown));
    if (json) {
      // Doubles print with the digits that read back to the same bits.
      const nlohmann::json out = {
          {"prompt", train::printable_text(prompts[i])},
          {"prompt_tokens", requests[i].prompt.size()},
          {"text", text},
          {"tokens", c.tokens},
          {"logprobs", c.logprobs},
          {"finish_reason", shown.size() < c.tokens.size() ? "stop" : "length"}};
      std::cout << out.dump() << '\n';
    } else {
      double total = 0;
      for (const double l : c.logprobs)
        total += l;
      std::cout << fmt::format("--- request {} ({} tokens, log-probability {:.4f})\n{}{}\n",
                               first + i, c.tokens.size(), total, train::printable_text(prompts[i]),
                               text);
    }
  }
  std::cout.flush();
}

/// How every window of prompts is turned into requests and printed.
struct GenerateJob {
  const GenerateOptions& options;
  generate::PromptFormat format;
  comm::ReductionMode mode;
  generate::GeneratorOptions generator;
  generate::Sampling sampling;
  std::int64_t new_tokens = 0;
};

/// Prompts decoded together before their completions print: enough to keep every slot busy,
/// few enough that results stream.
std::int64_t window_size(const generate::GeneratorOptions& options) {
  return std::max<std::int64_t>(64, 4 * options.max_batch);
}

/// Rank 0's next window of prompts, on every rank (collective). Empty at the end.
std::vector<std::string> next_window(comm::Communicator& world, generate::PromptSource* source,
                                     std::int64_t size) {
  std::vector<std::string> window;
  std::exception_ptr failure;
  if (world.rank() == 0) {
    try {
      for (std::int64_t i = 0; i < size; ++i) {
        std::optional<std::string> prompt = source->next();
        if (!prompt) break;
        window.push_back(std::move(*prompt));
      }
    } catch (...) {
      failure = std::current_exception();
    }
  }
  comm::throw_if_any_failed(world, failure);
  if (world.size() == 1) return window;
  // Prompts hold no line end, so one text of lines carries the window.
  std::string text;
  for (const std::string& prompt : window)
    text += prompt + "\n";
  text = comm::all_gather_text(world, world.rank() == 0 ? text : std::string())[0];
  window.clear();
  for (std::size_t at = 0; at < text.size();) {
    const std::size_t end = text.find('\n', at);
    window.push_back(text.substr(at, end - at));
    at = end + 1;
  }
  return window;
}

/// Loads the checkpoint on every rank, splits it over the ranks (a tensor-parallel group) and
/// generates window after window of prompts; rank 0 prints each window's completions in input
/// order as soon as they are done.
void generate_on_ranks(comm::Communicator& world, const GenerateJob& job,
                       generate::PromptSource* source) {
  const std::unique_ptr<tp::TensorParallel> tp = generate::generation_group(world, job.mode);
  const std::unique_ptr<nn::Decoder> model =
      generate::load_for_generation(world, job.options.checkpoint, *tp, job.mode,
                                    world.backend() == "threads" ? world.size() : 1);
  generate::Generator generator(*model, job.generator, tp.get());
  std::size_t first = 0;
  for (;;) {
    const std::vector<std::string> prompts = next_window(world, source, window_size(job.generator));
    if (prompts.empty()) break;
    std::vector<generate::Request> requests;
    for (std::size_t i = 0; i < prompts.size(); ++i) {
      requests.push_back(job.format.request(prompts[i], job.new_tokens, job.sampling));
      generate::check_request(requests.back(), first + i, model->decoder_spec());
    }
    const std::vector<generate::Completion> completions = generator.generate(requests);
    if (world.rank() == 0)
      print_completions(prompts, requests, completions, *job.format.tokenizer, job.options.json,
                        first);
    first += prompts.size();
  }
}

/// The architecture of the checkpoint, checked against its tensors, and the layout against it,
/// before any rank starts or allocates; sets the job's prompt format.
nn::DecoderSpec check_checkpoint_and_layout(const GenerateOptions& options, std::int64_t degree,
                                            GenerateJob& job) {
  const nn::DecoderSpec config = generate::model_architecture(options.checkpoint);
  if (degree > 1) tp::check_decoder_degree(config, degree);
  job.format = generate::prompt_format(generate::model_tokenizer(options.checkpoint), options.chat,
                                       options.chat_template, options.system);
  return config;
}

/// Every prompt of a regular file checked before anything is generated, so a bad line is an
/// error with no output; other sources (a pipe) are checked window by window.
void check_prompts_ahead(const GenerateOptions& options, const GenerateJob& job,
                         const nn::DecoderSpec& config) {
  if (options.prompts_option->count() == 0 || !std::filesystem::is_regular_file(options.prompts)) {
    return;
  }
  generate::PromptSource source = prompt_source(options);
  std::size_t i = 0;
  for (std::optional<std::string> prompt; (prompt = source.next()); ++i)
    generate::check_request(job.format.request(*prompt, job.new_tokens, job.sampling), i, config);
}

void run_generate(const GenerateOptions& options) {
  GenerateJob job{options, {}, comm::ReductionMode::ordered, {}, {}, 0};
  job.sampling.temperature = real_setting("--temperature", options.temperature, 0.0, 1e6);
  job.sampling.top_k = integer_setting("--top-k", options.top_k, 0, 1 << 30);
  job.sampling.seed = seed_setting("--seed", options.seed);
  job.new_tokens = integer_setting("--max-new-tokens", options.max_new_tokens, 1, 1 << 30);
  job.mode = comm::parse_reduction_mode(options.mode);
  if (job.mode == comm::ReductionMode::native) {
    throw ParseError(
        "--mode native: generation runs in ordered or exact mode (the trainer's bits need one of "
        "them)");
  }
  job.generator.max_batch = integer_setting("--max-batch", options.max_batch, 1, 4096);
  job.generator.prefill_chunk =
      integer_setting("--prefill-chunk", options.prefill_chunk, 1, 1 << 20);
  job.generator.exact_logprobs = job.mode == comm::ReductionMode::exact;
  const Backend backend = parse_backend(options.backend);
  const std::int64_t given =
      tensor_parallel_option(options.ranks, options.mesh, options.names, "generate");
  generate::PromptSource source = prompt_source(options);
  const nn::DecoderSpec config =
      check_checkpoint_and_layout(options, std::max<std::int64_t>(given, 1), job);
  check_prompts_ahead(options, job, config);
  run_ranks(backend, std::max<std::int64_t>(given, 1), "generate", [&](comm::Communicator& world) {
    if (backend == Backend::mpi && given > 0 && world.size() != given) {
      throw InvalidArgument(fmt::format("--{} {} does not match the mpi job's {} ranks",
                                        options.ranks.empty() ? "mesh" : "ranks", given,
                                        world.size()));
    }
    generate_on_ranks(world, job, &source);
  });
}

}  // namespace

void add_generate_command(CLI::App& app) {
  auto options = std::make_shared<GenerateOptions>();
  CLI::App* command = app.add_subcommand(
      "generate",
      "Continue prompts with a GPT checkpoint (any training layout): KV-cache decoding with "
      "continuous batching; each token's log-probability is the bits the trainer's forward "
      "gives it");
  command
      ->add_option("--checkpoint", options->checkpoint,
                   "checkpoint directory, or a root whose LATEST names one")
      ->required();
  options->prompt_option = command->add_option("--prompt", options->prompt, "one prompt");
  options->prompts_option =
      command->add_option("--prompts", options->prompts, "a file of prompts, one a line");
  command->add_option("--max-new-tokens", options->max_new_tokens,
                      "tokens to generate per prompt (default 64)");
  command->add_option("--temperature", options->temperature,
                      "sampling temperature, 0 for greedy (default 0.8)");
  command->add_option("--top-k", options->top_k,
                      "sample among the k largest logits (default 0: all)");
  command->add_option("--seed", options->seed,
                      "sampling seed: a token's draw depends on the seed and its position only");
  command->add_option("--mode", options->mode,
                      "ordered or exact (must match the training mode for bit parity)");
  command->add_option("--max-batch", options->max_batch, "requests decoded together (default 16)");
  command->add_option("--prefill-chunk", options->prefill_chunk,
                      "prompt tokens a request feeds per step (default 64)");
  command->add_option("--ranks", options->ranks,
                      "ranks generating together, the model split over them by tensor "
                      "parallelism (default 1)");
  command->add_option("--mesh", options->mesh, "the tensor-parallel degree, with --names tp");
  command->add_option("--names", options->names, "tp (the only dim generation takes)");
  command->add_option("--backend", options->backend, "threads (default) or mpi (under mpirun)");
  add_flag(*command, "--chat", options->chat,
           "each prompt is a user message, rendered by the model's chat template");
  command->add_option("--system", options->system, "with --chat: a system message first");
  command->add_option("--chat-template", options->chat_template,
                      "with --chat: a file holding a Jinja chat template to use instead");
  add_flag(*command, "--json", options->json,
           "one JSON object per prompt: prompt, text, tokens, logprobs, finish_reason");
  command->callback([options] { run_generate(*options); });
}

}  // namespace meshtensor::cli
