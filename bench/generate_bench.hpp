#pragma once

#include <cstdint>
#include <vector>

#include <meshtensor/nn/models.hpp>

namespace meshtensor::bench {

/// What `meshtensor bench generate` runs.
struct GenerateBenchOptions {
  std::int64_t prompt_tokens = 16;  ///< each request's prompt
  std::int64_t new_tokens = 64;     ///< tokens each request generates
  std::vector<std::int64_t> batches{1, 16};
  int rounds = 3;  ///< alternated rounds of every variant; medians reported
};

/// Decode throughput of one batch size: the generator's batch-invariant path, a batch-variant
/// path (OpenBLAS sgemm in every Linear) and exact mode, timed in the same run. Decode time is
/// a run of new_tokens tokens less a run of one (the prompts' prefill), so tokens/s count
/// decode steps alone.
struct GenerateBenchRow {
  std::int64_t batch = 0;
  double ordered_tokens_s = 0;        ///< batch-invariant, ordered mode
  double batch_variant_tokens_s = 0;  ///< ordered, OpenBLAS in the Linears
  double exact_tokens_s = 0;          ///< batch-invariant, exact mode
  double invariance_cost = 0;         ///< invariant decode time / batch-variant decode time
  double exact_over_ordered = 0;      ///< exact decode time / ordered decode time
  bool batch_invariant = false;       ///< every request's tokens and log-prob bits equal alone
  std::vector<std::vector<std::int64_t>> prompts;  ///< the requests' prompts
  std::vector<std::vector<std::int64_t>> tokens;   ///< what they generated (ordered, greedy)
};

/// Times `model`'s generator (greedy, one slot per request) for each batch size. The model's
/// exact sums are restored as they were.
std::vector<GenerateBenchRow> run_generate_bench(nn::Decoder& model,
                                                 const GenerateBenchOptions& options);

}  // namespace meshtensor::bench
