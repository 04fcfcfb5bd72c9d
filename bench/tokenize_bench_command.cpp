#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <meshtensor/core/error.hpp>
#include <meshtensor/tokenize/bpe_trainer.hpp>
#include <meshtensor/tokenize/tokenizer.hpp>
#include <meshtensor/train/text_data.hpp>

#include "bench_commands.hpp"
#include "options.hpp"
#include "timing.hpp"

namespace meshtensor::cli {

namespace {

struct TokenizeBenchOptions {
  std::string data = train::kDefaultTextDir;
  std::string tokenizer;  // empty: train one of `vocab` tokens on the text
  std::string vocab = "8192";
  std::string rounds = "5";
  std::string reference;  // a node_modules holding @huggingface/tokenizers
  std::string package;    // the vocabulary's own npm package, timed too
  bool json = false;
};

/// The reference's encode speed (MB/s) and id count on the same text and tokenizer, by node.
nlohmann::json reference_speed(const TokenizeBenchOptions& options, const std::string& tokenizer,
                               const std::string& text, std::int64_t rounds) {
  const std::filesystem::path scratch =
      std::filesystem::temp_directory_path() / fmt::format("meshtensor-bench-{}", ::getpid());
  std::filesystem::create_directories(scratch);
  const auto cleanup =
      std::shared_ptr<void>(nullptr, [&](void*) { std::filesystem::remove_all(scratch); });
  std::ofstream(scratch / "tokenizer.json") << tokenizer;
  std::ofstream(scratch / "text.txt", std::ios::binary) << text;
  const std::string script =
      (std::filesystem::path(MESHTENSOR_BENCH_SOURCE_DIR) / "tokenize_reference.mjs").string();
  const std::string command =
      fmt::format("node '{}' '{}' '{}' '{}' {} {}", script, options.reference,
                  (scratch / "tokenizer.json").string(), (scratch / "text.txt").string(), rounds,
                  options.package.empty() ? std::string() : "'" + options.package + "'");
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(command.c_str(), "r"), pclose);
  std::string out;
  char buffer[4096];
  while (pipe && fgets(buffer, sizeof(buffer), pipe.get()) != nullptr)
    out += buffer;
  const nlohmann::json result = nlohmann::json::parse(out, nullptr, false);
  if (result.is_discarded() || !result.is_array() || result.empty()) {
    throw DataError(
        fmt::format("--reference {}: the reference did not run ({}): node and "
                    "@huggingface/tokenizers (and --package) are needed",
                    options.reference, out.empty() ? "no output" : out));
  }
  return result;
}

/// The median seconds of `rounds` calls of `work`.
template <class Work>
double median_seconds(std::int64_t rounds, const Work& work) {
  std::vector<double> seconds;
  for (std::int64_t r = 0; r < rounds; ++r)
    seconds.push_back(bench::time_once(work));
  return bench::median(seconds);
}

/// The fastest reference's figure `key` (MB/s) and its name.
std::pair<double, std::string> fastest(const nlohmann::json& references, const char* key) {
  std::pair<double, std::string> best{0.0, ""};
  for (const nlohmann::json& r : references) {
    if (r[key].get<double>() > best.first) best = {r[key].get<double>(), r["name"]};
  }
  return best;
}

void run(const TokenizeBenchOptions& options) {
  bench::print_machine_line(options.json);
  const std::int64_t rounds = integer_setting("--rounds", options.rounds, 1, 1000);
  const train::TextCorpus corpus = train::load_text(options.data);
  const std::string& text = corpus.train;
  tokenize::BpeTrainerConfig trainer;
  trainer.vocabulary = integer_setting("--vocab", options.vocab, 257, 1 << 24);
  double train_seconds = 0;
  std::unique_ptr<tokenize::Tokenizer> tokenizer;
  if (options.tokenizer.empty()) {
    train_seconds = bench::time_once([&] {
      tokenizer = std::make_unique<tokenize::Tokenizer>(tokenize::train_bpe(text, trainer));
    });
  }
  const double load_seconds = options.tokenizer.empty() ? 0.0 : median_seconds(rounds, [&] {
    tokenizer = std::make_unique<tokenize::Tokenizer>(tokenize::Tokenizer::load(options.tokenizer));
  });
  std::vector<std::int64_t> ids;
  const double megabytes = static_cast<double>(text.size()) / 1e6;
  const double ours = megabytes / median_seconds(rounds, [&] { ids = tokenizer->encode(text); });
  std::size_t decoded = 0;
  const double decode = megabytes / median_seconds(rounds, [&] {
                          decoded = tokenizer->decode_text(ids, false).size();
                        });
  if (decoded != text.size())
    throw DataError(fmt::format("decoding gave {} bytes of the {}", decoded, text.size()));
  nlohmann::json out = {{"bytes", text.size()},
                        {"ids", ids.size()},
                        {"vocabulary", tokenizer->vocabulary()},
                        {"train_seconds", train_seconds},
                        {"load_seconds", load_seconds},
                        {"megabytes_per_second", ours},
                        {"decode_megabytes_per_second", decode}};
  if (!options.reference.empty()) {
    const nlohmann::json references = reference_speed(options, tokenizer->to_json(), text, rounds);
    out["references"] = references;
    const auto [encode_best, encode_name] = fastest(references, "megabytes_per_second");
    const auto [decode_best, decode_name] = fastest(references, "decode_megabytes_per_second");
    out["ratio"] = ours / encode_best;
    out["decode_ratio"] = decode / decode_best;
    out["fastest_reference"] = encode_name;
    out["fastest_decode_reference"] = decode_name;
  }
  if (options.json) {
    std::cout << out.dump() << '\n';
    return;
  }
  std::cout << fmt::format(
      "encode {} bytes of training text with {} tokens ({} ids): {:.1f} MB/s on one thread{}; "
      "decode {:.1f} MB/s\n",
      text.size(), tokenizer->vocabulary(), ids.size(), ours,
      options.tokenizer.empty() ? fmt::format(" (trained in {:.2f} s)", train_seconds)
                                : fmt::format(" (loaded in {:.3f} s)", load_seconds),
      decode);
  if (!out.contains("ratio")) return;
  for (const nlohmann::json& r : out["references"]) {
    std::cout << fmt::format(
        "{} (node): encode {:.2f} MB/s ({} ids), decode {:.2f} MB/s, loaded in {:.3f} s\n",
        r["name"].get<std::string>(), r["megabytes_per_second"].get<double>(),
        r["ids"].get<std::int64_t>(), r["decode_megabytes_per_second"].get<double>(),
        r["load_seconds"].get<double>());
  }
  std::cout << fmt::format("meshtensor: encode {:.1f}x the fastest ({}), decode {:.1f}x ({})\n",
                           out["ratio"].get<double>(), out["fastest_reference"].get<std::string>(),
                           out["decode_ratio"].get<double>(),
                           out["fastest_decode_reference"].get<std::string>());
}

}  // namespace

void add_tokenize_bench(CLI::App& bench) {
  const auto options = std::make_shared<TokenizeBenchOptions>();
  CLI::App* command = bench.add_subcommand(
      "tokenize",
      "BPE: load, encode and decode speed, and the JavaScript references' (--reference)");
  command->add_option("--data", options->data, "the text (its training records)")
      ->capture_default_str();
  command->add_option("--tokenizer", options->tokenizer,
                      "a tokenizer.json (default: train one of --vocab tokens on the text)");
  command->add_option("--vocab", options->vocab, "tokens to train")->capture_default_str();
  command->add_option("--rounds", options->rounds, "timed encodes (median)")->capture_default_str();
  command->add_option("--reference", options->reference,
                      "a node_modules folder with @huggingface/tokenizers: time it too");
  command->add_option("--package", options->package,
                      "the vocabulary's own package in it, timed too: gpt-3-encoder, "
                      "llama-tokenizer-js, mistral-tokenizer-js, llama3-tokenizer-js, or "
                      "js-tiktoken:ENCODING");
  add_flag(*command, "--json", options->json, "print one JSON object");
  command->callback([options] { run(*options); });
}

}  // namespace meshtensor::cli
