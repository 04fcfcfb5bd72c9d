#include "generate_bench.hpp"

#include <algorithm>
#include <chrono>
#include <functional>

#include <meshtensor/core/random.hpp>
#include <meshtensor/generate/generator.hpp>
#include <meshtensor/kernels/openblas_baseline.hpp>

#include "matmul_bench.hpp"
#include "timing.hpp"

namespace meshtensor::bench {

namespace {

std::vector<generate::Request> requests_for(std::int64_t vocabulary, std::int64_t batch,
                                            std::int64_t prompt, std::int64_t new_tokens) {
  std::vector<generate::Request> requests;
  for (std::int64_t r = 0; r < batch; ++r) {
    std::vector<std::int64_t> tokens;
    for (std::int64_t i = 0; i < prompt; ++i)
      tokens.push_back(uniform_int_sample(static_cast<std::uint64_t>(r) + 1,
                                          static_cast<std::uint64_t>(i), 0, vocabulary - 1));
    requests.push_back({tokens, new_tokens, {}});
  }
  return requests;
}

/// Seconds of decode steps: a run of `new_tokens` less a run of one token.
double decode_seconds(nn::Decoder& model, std::int64_t batch, const GenerateBenchOptions& options,
                      bool exact) {
  generate::GeneratorOptions generator_options;
  generator_options.max_batch = batch;
  generator_options.exact_logprobs = exact;
  generate::Generator generator(model, generator_options);
  const auto timed = [&](std::int64_t new_tokens) {
    const auto requests =
        requests_for(model.vocabulary(), batch, options.prompt_tokens, new_tokens);
    const auto start = std::chrono::steady_clock::now();
    generator.generate(requests);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  return std::max(1e-9, timed(options.new_tokens) - timed(1));
}

/// Generates the batch together and each request alone: `row` gets the prompts, the tokens and
/// whether every request got the same bits both ways.
void check_batch_invariance(nn::Decoder& model, const GenerateBenchOptions& options,
                            GenerateBenchRow& row) {
  const auto requests =
      requests_for(model.vocabulary(), row.batch, options.prompt_tokens, options.new_tokens);
  generate::Generator together(model, {row.batch, 64, false});
  const auto batched = together.generate(requests);
  generate::Generator alone(model, {1, 64, false});
  row.batch_invariant = true;
  for (std::size_t r = 0; r < requests.size(); ++r) {
    const auto single = alone.generate({requests[r]}).front();
    row.batch_invariant = row.batch_invariant && single.tokens == batched[r].tokens &&
                          single.logprobs == batched[r].logprobs;
    row.prompts.push_back(requests[r].prompt);
    row.tokens.push_back(batched[r].tokens);
  }
}

}  // namespace

std::vector<GenerateBenchRow> run_generate_bench(nn::Decoder& model,
                                                 const GenerateBenchOptions& options) {
  const bool was_exact = model.exact_sums();
  const nn::MatmulOverride blas = kernels::openblas_linear_matmul();
  std::vector<GenerateBenchRow> rows;
  for (const std::int64_t batch : options.batches) {
    std::vector<double> ordered, variant, exact;
    for (int round = 0; round < options.rounds; ++round) {
      model.set_exact_sums(false);
      ordered.push_back(decode_seconds(model, batch, options, false));
      {
        const nn::BatchVariantScope fast(blas);
        variant.push_back(decode_seconds(model, batch, options, false));
      }
      model.set_exact_sums(true);
      exact.push_back(decode_seconds(model, batch, options, true));
    }
    model.set_exact_sums(false);
    const double tokens = static_cast<double>(batch * (options.new_tokens - 1));
    GenerateBenchRow row;
    row.batch = batch;
    row.ordered_tokens_s = tokens / median(ordered);
    row.batch_variant_tokens_s = tokens / median(variant);
    row.exact_tokens_s = tokens / median(exact);
    row.invariance_cost = median(ordered) / median(variant);
    row.exact_over_ordered = median(exact) / median(ordered);
    check_batch_invariance(model, options, row);
    rows.push_back(row);
  }
  model.set_exact_sums(was_exact);
  return rows;
}

}  // namespace meshtensor::bench
