#pragma once

#include <cstdint>
#include <string>

#include <meshtensor/nn/models.hpp>

namespace meshtensor::bench {

/// What `meshtensor bench serve` runs.
struct ServeBenchConfig {
  std::string checkpoint;  ///< the served checkpoint (empty: a fresh `model` saved to a temp dir)
  nn::DecoderSpec model;
  std::int64_t clients = 32;             ///< concurrent streaming clients
  double seconds = 10;                   ///< load time of each server, in 3 alternating rounds
  std::int64_t prompt_tokens = 16;       ///< each request's prompt
  std::int64_t new_tokens = 64;          ///< each request's max_tokens
  std::int64_t max_batch = 0;            ///< the server's (0: clients)
  std::int64_t stream_interval_ms = 10;  ///< the server's (ServeConfig::stream_interval_ms)
};

/// One load phase: `clients` streaming clients sending requests back to back against one server.
struct LoadFigures {
  std::int64_t requests = 0;  ///< completed with every token and [DONE]
  std::int64_t failed = 0;    ///< an HTTP error, a broken stream or missing tokens
  std::int64_t lost = 0;      ///< sent and never answered before the phase ended
  std::int64_t tokens = 0;
  double seconds = 0;
  double requests_per_second = 0;
  double tokens_per_second = 0;
  double ttft_p50 = 0;  ///< time to first token, seconds
  double ttft_p99 = 0;
  double tpot_p50 = 0;  ///< per-token latency after the first, seconds
  double tpot_p99 = 0;
  bool probe_identical = false;  ///< a seeded probe under load had its bits alone
};

/// Everything `meshtensor bench serve` prints.
struct ServeBenchResult {
  LoadFigures invariant;      ///< the server as shipped (batch-invariant kernels)
  LoadFigures batch_variant;  ///< the same server with OpenBLAS in every Linear
  /// The generator alone, `clients` requests of the same lengths decoded together (the
  /// `bench generate` path, prefill included), tokens/s: the median of the rounds timed
  /// before, between and after the servers' rounds.
  double generator_tokens_per_second = 0;
  /// The same with OpenBLAS in every Linear: the generator's own cost of batch invariance.
  double generator_batch_variant_tokens_per_second = 0;
  std::string model;  ///< the served model's text
};

/// Runs the server in this process (1 thread rank, ordered mode, loopback port) and the clients
/// on threads: the invariant server, the batch-variant server, and the generator alone.
ServeBenchResult run_serve_bench(const ServeBenchConfig& config);

}  // namespace meshtensor::bench
