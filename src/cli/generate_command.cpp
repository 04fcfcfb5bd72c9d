#include <fstream>
#include <iostream>
#include <memory>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <meshtensor/comm/communicator.hpp>
#include <meshtensor/core/error.hpp>
#include <meshtensor/generate/generator.hpp>
#include <meshtensor/generate/load.hpp>
#include <meshtensor/tp/style.hpp>
#include <meshtensor/train/text_data.hpp>

#include "backend.hpp"
#include "commands.hpp"
#include "generate_bench.hpp"
#include "options.hpp"

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
  bool json = false;
  CLI::Option* prompt_option = nullptr;
  CLI::Option* prompts_option = nullptr;
};

/// The prompts: --prompt, or the lines of --prompts (without their line ends).
std::vector<std::string> read_prompts(const GenerateOptions& options) {
  if (options.prompt_option->count() > 0 && options.prompts_option->count() > 0)
    throw ParseError("--prompt and --prompts exclude each other: give one");
  if (options.prompts_option->count() == 0) {
    if (options.prompt_option->count() == 0)
      throw ParseError("give --prompt TEXT or --prompts FILE");
    return {options.prompt};
  }
  std::ifstream file(options.prompts);
  if (!file) throw DataError(fmt::format("--prompts {}: cannot open the file", options.prompts));
  std::vector<std::string> prompts;
  for (std::string line; std::getline(file, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    prompts.push_back(line);
  }
  if (prompts.empty()) throw DataError(fmt::format("--prompts {} holds no line", options.prompts));
  return prompts;
}

void print_completions(const std::vector<std::string>& prompts,
                       const std::vector<generate::Completion>& completions, bool json) {
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    const generate::Completion& c = completions[i];
    const std::string text = train::printable_text(generate::token_bytes(c.tokens));
    if (json) {
      // Doubles print with the digits that read back to the same bits.
      const nlohmann::json out = {{"prompt", train::printable_text(prompts[i])},
                                  {"text", text},
                                  {"tokens", c.tokens},
                                  {"logprobs", c.logprobs}};
      std::cout << out.dump() << '\n';
    } else {
      double total = 0;
      for (const double l : c.logprobs)
        total += l;
      std::cout << fmt::format("--- request {} ({} tokens, log-probability {:.4f})\n{}{}\n", i,
                               c.tokens.size(), total, train::printable_text(prompts[i]), text);
    }
  }
}

/// The tensor-parallel degree: --ranks N, or --mesh N --names tp (1 by default).
std::int64_t tensor_parallel_degree(const GenerateOptions& options) {
  if (!options.mesh.empty() || !options.names.empty()) {
    if (!options.ranks.empty()) throw ParseError("--ranks and --mesh exclude each other: give one");
    if (options.names != "tp") {
      throw ParseError(
          fmt::format("generate runs on a 1-D tensor-parallel mesh: --names must be tp, got '{}'",
                      options.names));
    }
    return integer_option("--mesh", options.mesh, 1, comm::kMaxThreadsRanks);
  }
  return options.ranks.empty()
             ? 1
             : integer_option("--ranks", options.ranks, 1, comm::kMaxThreadsRanks);
}

/// Loads the checkpoint on every rank, splits it over the ranks (a tensor-parallel group) and
/// generates; rank 0 prints.
void generate_on_ranks(comm::Communicator& world, const GenerateOptions& options,
                       comm::ReductionMode mode,
                       const generate::GeneratorOptions& generator_options,
                       const std::vector<std::string>& prompts,
                       const std::vector<generate::Request>& requests) {
  const std::unique_ptr<nn::Gpt> model = generate::load_gpt(world, options.checkpoint);
  model->set_exact_sums(mode == comm::ReductionMode::exact);
  tp::TensorParallel tp(std::shared_ptr<comm::Communicator>(&world, [](comm::Communicator*) {}),
                        mode, false);
  if (tp.size() > 1) {
    tp::check_gpt_degree(model->config(), tp.size());
    tp::parallelize_module(*model, tp, tp::gpt_plan(false));
  }
  generate::Generator generator(*model, generator_options, &tp);
  const std::vector<generate::Completion> completions = generator.generate(requests);
  if (world.rank() == 0) print_completions(prompts, completions, options.json);
}

void run_generate(const GenerateOptions& options) {
  const std::vector<std::string> prompts = read_prompts(options);
  generate::Sampling sampling;
  sampling.temperature = real_option("--temperature", options.temperature, 0.0, 1e6);
  sampling.top_k = integer_option("--top-k", options.top_k, 0, 1 << 30);
  sampling.seed = seed_option("--seed", options.seed);
  const std::int64_t new_tokens =
      integer_option("--max-new-tokens", options.max_new_tokens, 1, 1 << 30);
  const comm::ReductionMode mode = comm::parse_reduction_mode(options.mode);
  generate::GeneratorOptions generator_options;
  generator_options.max_batch = integer_option("--max-batch", options.max_batch, 1, 4096);
  generator_options.prefill_chunk =
      integer_option("--prefill-chunk", options.prefill_chunk, 1, 1 << 20);
  generator_options.exact_logprobs = mode == comm::ReductionMode::exact;
  std::vector<generate::Request> requests;
  for (const std::string& p : prompts)
    requests.push_back({generate::byte_tokens(p), new_tokens, sampling});
  const Backend backend = parse_backend(options.backend);
  const std::int64_t degree = tensor_parallel_degree(options);
  run_ranks(backend, degree, "generate", [&](comm::Communicator& world) {
    generate_on_ranks(world, options, mode, generator_options, prompts, requests);
  });
}

struct GenerateBenchCliOptions {
  std::string checkpoint;
  std::string model = "gpt";
  std::string prompt_tokens = "16";
  std::string new_tokens = "64";
  std::string batches = "1,16";
  std::string rounds = "3";
  bool json = false;
};

void print_generate_bench(const std::vector<bench::GenerateBenchRow>& rows,
                          const bench::GenerateBenchOptions& options, const nn::GptConfig& config,
                          bool json) {
  if (json) {
    nlohmann::json out = nlohmann::json::array();
    for (const bench::GenerateBenchRow& r : rows) {
      out.push_back({{"batch", r.batch},
                     {"ordered_tokens_s", r.ordered_tokens_s},
                     {"batch_variant_tokens_s", r.batch_variant_tokens_s},
                     {"exact_tokens_s", r.exact_tokens_s},
                     {"invariance_cost", r.invariance_cost},
                     {"exact_over_ordered", r.exact_over_ordered},
                     {"batch_invariant", r.batch_invariant},
                     {"prompts", r.prompts},
                     {"tokens", r.tokens}});
    }
    std::cout << nlohmann::json{{"model", nn::gpt_config_text(config)},
                                {"prompt_tokens", options.prompt_tokens},
                                {"new_tokens", options.new_tokens},
                                {"rows", out}}
                     .dump()
              << '\n';
    return;
  }
  std::cout << fmt::format(
      "generate bench: {}, prompts of {} tokens, {} new tokens each, greedy, 1 thread; decode "
      "tokens/s (prefill excluded), medians of {} alternated rounds\n",
      nn::gpt_config_text(config), options.prompt_tokens, options.new_tokens, options.rounds);
  std::cout << fmt::format("{:>6} {:>14} {:>16} {:>12} {:>16} {:>15} {:>10}\n", "batch",
                           "invariant", "batch-variant", "exact", "invariance cost",
                           "exact/ordered", "invariant");
  for (const bench::GenerateBenchRow& r : rows) {
    std::cout << fmt::format("{:>6} {:>14.0f} {:>16.0f} {:>12.0f} {:>15.3f}x {:>14.3f}x {:>10}\n",
                             r.batch, r.ordered_tokens_s, r.batch_variant_tokens_s,
                             r.exact_tokens_s, r.invariance_cost, r.exact_over_ordered,
                             r.batch_invariant ? "yes" : "NO");
  }
  std::cout << "batch-variant: OpenBLAS sgemm in every Linear; invariance cost = invariant / "
               "batch-variant decode time (goal <= 1.15)\n";
}

void run_generate_bench(const GenerateBenchCliOptions& options) {
  bench::GenerateBenchOptions bench_options;
  bench_options.prompt_tokens =
      integer_option("--prompt-tokens", options.prompt_tokens, 1, 1 << 20);
  bench_options.new_tokens = integer_option("--new-tokens", options.new_tokens, 2, 1 << 20);
  bench_options.rounds = static_cast<int>(integer_option("--rounds", options.rounds, 1, 100));
  bench_options.batches.clear();
  for (const std::string& b : list_option("--batches", options.batches))
    bench_options.batches.push_back(integer_option("--batches", b, 1, 4096));
  run_ranks(Backend::threads, 1, "bench generate", [&](comm::Communicator& world) {
    std::unique_ptr<nn::Gpt> model =
        options.checkpoint.empty() ? std::make_unique<nn::Gpt>(nn::parse_gpt_config(options.model))
                                   : generate::load_gpt(world, options.checkpoint);
    const nn::GptConfig& config = model->config();
    if (bench_options.prompt_tokens + bench_options.new_tokens > config.context) {
      throw ParseError(
          fmt::format("--prompt-tokens {} plus --new-tokens {} exceed the model's context of {}",
                      bench_options.prompt_tokens, bench_options.new_tokens, config.context));
    }
    print_generate_bench(bench::run_generate_bench(*model, bench_options), bench_options, config,
                         options.json);
  });
}

}  // namespace

void add_generate_bench(CLI::App& bench) {
  auto options = std::make_shared<GenerateBenchCliOptions>();
  CLI::App* command = bench.add_subcommand(
      "generate",
      "Decode tokens/s of the batch-invariant generator at several batch sizes against a "
      "batch-variant path (OpenBLAS sgemm in every Linear) and exact mode, in the same run");
  command->add_option("--checkpoint", options->checkpoint,
                      "a GPT checkpoint (default: a fresh --model)");
  command->add_option("--model", options->model, "gpt:... when no checkpoint (default gpt)");
  command->add_option("--prompt-tokens", options->prompt_tokens, "prompt length (default 16)");
  command->add_option("--new-tokens", options->new_tokens, "tokens per request (default 64)");
  command->add_option("--batches", options->batches, "batch sizes (default 1,16)");
  command->add_option("--rounds", options->rounds, "alternated rounds (default 3)");
  add_flag(*command, "--json", options->json, "print one JSON object");
  command->callback([options] { run_generate_bench(*options); });
}

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
  add_flag(*command, "--json", options->json,
           "one JSON object per prompt: prompt, text, tokens, logprobs");
  command->callback([options] { run_generate(*options); });
}

}  // namespace meshtensor::cli
