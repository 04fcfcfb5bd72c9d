#include <iostream>
#include <memory>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <meshtensor/core/error.hpp>
#include <meshtensor/generate/load.hpp>
#include <meshtensor/kernels/simd.hpp>
#include <meshtensor/nn/models.hpp>

#include "backend.hpp"
#include "bench_commands.hpp"
#include "generate_bench.hpp"
#include "options.hpp"
#include "timing.hpp"

namespace meshtensor::cli {

namespace {

struct GenerateBenchCliOptions {
  std::string checkpoint;
  std::string model = "gpt";
  std::string prompt_tokens = "16";
  std::string new_tokens = "64";
  std::string batches = "1,16";
  std::string rounds = "3";
  std::string simd;
  bool json = false;
};

/// --simd baseline|avx2|avx512: the kernels a benchmark times (default: the widest this CPU
/// runs), so that one host reports every kernel path it has.
void apply_simd_option(const std::string& text) {
  if (text.empty()) return;
  for (const auto level :
       {kernels::SimdLevel::baseline, kernels::SimdLevel::avx2, kernels::SimdLevel::avx512}) {
    if (text == kernels::simd_level_name(level)) return kernels::set_simd_level(level);
  }
  throw ParseError(fmt::format("--simd '{}' is not baseline, avx2 or avx512", text));
}

void print_generate_bench(const std::vector<bench::GenerateBenchRow>& rows,
                          const bench::GenerateBenchOptions& options, const std::string& model,
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
    std::cout << nlohmann::json{{"machine", kernels::machine_description()},
                                {"model", model},
                                {"prompt_tokens", options.prompt_tokens},
                                {"new_tokens", options.new_tokens},
                                {"rows", out}}
                     .dump()
              << '\n';
    return;
  }
  bench::print_machine_line(json);
  std::cout << fmt::format(
      "generate bench: {}, prompts of {} tokens, {} new tokens each, greedy, 1 thread; decode "
      "tokens/s (prefill excluded), medians of {} alternated rounds\n",
      model, options.prompt_tokens, options.new_tokens, options.rounds);
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
  apply_simd_option(options.simd);
  bench::GenerateBenchOptions bench_options;
  bench_options.prompt_tokens =
      integer_setting("--prompt-tokens", options.prompt_tokens, 1, 1 << 20);
  bench_options.new_tokens = integer_setting("--new-tokens", options.new_tokens, 2, 1 << 20);
  bench_options.rounds = static_cast<int>(integer_setting("--rounds", options.rounds, 1, 100));
  bench_options.batches.clear();
  for (const std::string& b : list_setting("--batches", options.batches))
    bench_options.batches.push_back(integer_setting("--batches", b, 1, 4096));
  run_ranks(Backend::threads, 1, "bench generate", [&](comm::Communicator& world) {
    std::unique_ptr<nn::Decoder> model =
        options.checkpoint.empty() ? nn::make_decoder(nn::parse_decoder_spec(options.model))
                                   : generate::load_decoder(world, options.checkpoint);
    if (bench_options.prompt_tokens + bench_options.new_tokens > model->context()) {
      throw ParseError(
          fmt::format("--prompt-tokens {} plus --new-tokens {} exceed the model's context of {}",
                      bench_options.prompt_tokens, bench_options.new_tokens, model->context()));
    }
    print_generate_bench(bench::run_generate_bench(*model, bench_options), bench_options,
                         model->config_text(), options.json);
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
                      "a gpt or llama checkpoint (default: a fresh --model)");
  command->add_option("--model", options->model,
                      "gpt:... or llama:... when no checkpoint (default gpt)");
  command->add_option("--prompt-tokens", options->prompt_tokens, "prompt length (default 16)");
  command->add_option("--new-tokens", options->new_tokens, "tokens per request (default 64)");
  command->add_option("--batches", options->batches, "batch sizes (default 1,16)");
  command->add_option("--rounds", options->rounds, "alternated rounds (default 3)");
  command->add_option("--simd", options->simd,
                      "kernels to time: baseline, avx2 or avx512 (default: the widest here)");
  add_flag(*command, "--json", options->json, "print one JSON object");
  command->callback([options] { run_generate_bench(*options); });
}

}  // namespace meshtensor::cli
