#include <iostream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <meshtensor/kernels/simd.hpp>

#include "bench_commands.hpp"
#include "options.hpp"
#include "serve_bench.hpp"
#include "timing.hpp"

namespace meshtensor::cli {

namespace {

struct ServeBenchCliOptions {
  std::string checkpoint;
  std::string model = "gpt";
  std::string clients = "32";
  std::string seconds = "10";
  std::string prompt_tokens = "16";
  std::string new_tokens = "64";
  std::string max_batch = "0";
  std::string stream_interval_ms = "10";
  bool json = false;
};

nlohmann::json load_json(const bench::LoadFigures& f) {
  return {{"requests", f.requests},
          {"failed", f.failed},
          {"lost", f.lost},
          {"tokens", f.tokens},
          {"seconds", f.seconds},
          {"requests_per_second", f.requests_per_second},
          {"tokens_per_second", f.tokens_per_second},
          {"ttft_p50_s", f.ttft_p50},
          {"ttft_p99_s", f.ttft_p99},
          {"per_token_p50_s", f.tpot_p50},
          {"per_token_p99_s", f.tpot_p99},
          {"probe_identical_under_load", f.probe_identical}};
}

void print_load(const std::string& name, const bench::LoadFigures& f) {
  std::cout << fmt::format(
      "{:<15} {:>7} {:>6} {:>5} {:>9.1f} {:>9.0f} {:>9.1f} {:>9.1f} {:>9.2f} {:>9.2f} {:>6}\n",
      name, f.requests, f.failed, f.lost, f.requests_per_second, f.tokens_per_second,
      f.ttft_p50 * 1e3, f.ttft_p99 * 1e3, f.tpot_p50 * 1e3, f.tpot_p99 * 1e3,
      f.probe_identical ? "yes" : "NO");
}

void run_serve_bench_command(const ServeBenchCliOptions& options) {
  bench::ServeBenchConfig config;
  config.checkpoint = options.checkpoint;
  config.model = nn::parse_decoder_spec(options.model);
  config.clients = integer_setting("--clients", options.clients, 1, 1024);
  config.seconds = real_setting("--seconds", options.seconds, 0.1, 3600);
  config.prompt_tokens = integer_setting("--prompt-tokens", options.prompt_tokens, 1, 1 << 20);
  config.new_tokens = integer_setting("--new-tokens", options.new_tokens, 2, 1 << 20);
  config.max_batch = integer_setting("--max-batch", options.max_batch, 0, 4096);
  config.stream_interval_ms =
      integer_setting("--stream-interval-ms", options.stream_interval_ms, 0, 10000);
  const bench::ServeBenchResult r = bench::run_serve_bench(config);
  const double http_cost = r.generator_tokens_per_second / r.invariant.tokens_per_second;
  const double determinism_cost = r.batch_variant.tokens_per_second / r.invariant.tokens_per_second;
  const double generator_cost =
      r.generator_batch_variant_tokens_per_second / r.generator_tokens_per_second;
  if (options.json) {
    std::cout << nlohmann::json{{"machine", kernels::machine_description()},
                                {"model", r.model},
                                {"clients", config.clients},
                                {"prompt_tokens", config.prompt_tokens},
                                {"new_tokens", config.new_tokens},
                                {"stream_interval_ms", config.stream_interval_ms},
                                {"invariant", load_json(r.invariant)},
                                {"batch_variant", load_json(r.batch_variant)},
                                {"generator_tokens_per_second", r.generator_tokens_per_second},
                                {"generator_over_server", http_cost},
                                {"batch_variant_over_invariant", determinism_cost},
                                {"generator_batch_variant_tokens_per_second",
                                 r.generator_batch_variant_tokens_per_second},
                                {"generator_batch_variant_over_invariant", generator_cost}}
                     .dump()
              << '\n';
    return;
  }
  bench::print_machine_line(false);
  std::cout << fmt::format(
      "serve bench: {}, {} streaming clients for {} s per server (3 alternating rounds), "
      "prompts of {} tokens, {} new tokens, stream interval {} ms (greedy; client 0 sends a "
      "seeded probe every 4th request)\n",
      r.model, config.clients, config.seconds, config.prompt_tokens, config.new_tokens,
      config.stream_interval_ms);
  std::cout << fmt::format("{:<15} {:>7} {:>6} {:>5} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>6}\n",
                           "server", "done", "failed", "lost", "req/s", "tokens/s", "ttft p50",
                           "ttft p99", "tok p50", "tok p99", "probe");
  print_load("invariant", r.invariant);
  print_load("batch-variant", r.batch_variant);
  std::cout << fmt::format(
      "latencies in ms; probe: a seeded request under load had its bits alone\n"
      "generator alone, {} requests together: {:.0f} tokens/s; generator / server: {:.3f}x "
      "(goal <= 1.2)\n"
      "batch-variant / invariant tokens/s: server {:.3f}x, generator alone {:.3f}x (the cost of "
      "determinism under load, and the generator's own)\n",
      config.clients, r.generator_tokens_per_second, http_cost, determinism_cost, generator_cost);
}

}  // namespace

void add_serve_bench(CLI::App& bench) {
  auto options = std::make_shared<ServeBenchCliOptions>();
  CLI::App* command = bench.add_subcommand(
      "serve",
      "Concurrent streaming clients against `meshtensor serve` in this process: requests/s, "
      "tokens/s, time to first token and per-token latency, failed and lost requests, a seeded "
      "request's bits alone and under load; against the generator alone and a batch-variant "
      "server, in the same run");
  command->add_option("--checkpoint", options->checkpoint,
                      "the served checkpoint (default: a fresh --model)");
  command->add_option("--model", options->model,
                      "gpt:... or llama:... when no checkpoint (default gpt)");
  command->add_option("--clients", options->clients, "concurrent streaming clients (default 32)");
  command->add_option("--seconds", options->seconds, "seconds of each load phase (default 10)");
  command->add_option("--prompt-tokens", options->prompt_tokens, "prompt length (default 16)");
  command->add_option("--new-tokens", options->new_tokens, "max_tokens per request (default 64)");
  command->add_option("--max-batch", options->max_batch,
                      "the server's batch (default 0: the number of clients)");
  command->add_option("--stream-interval-ms", options->stream_interval_ms,
                      "the server's --stream-interval-ms (default 10)");
  add_flag(*command, "--json", options->json, "print one JSON object");
  command->callback([options] { run_serve_bench_command(*options); });
}

}  // namespace meshtensor::cli
