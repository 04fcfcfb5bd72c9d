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
      fmt::format("node '{}' '{}' '{}' '{}' {}", script, options.reference,
                  (scratch / "tokenizer.json").string(), (scratch / "text.txt").string(), rounds);
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(command.c_str(), "r"), pclose);
  std::string out;
  char buffer[4096];
  while (pipe && fgets(buffer, sizeof(buffer), pipe.get()) != nullptr)
    out += buffer;
  const nlohmann::json result = nlohmann::json::parse(out, nullptr, false);
  if (result.is_discarded() || !result.contains("megabytes_per_second")) {
    throw DataError(
        fmt::format("--reference {}: the reference did not run ({}): node and "
                    "@huggingface/tokenizers are needed",
                    options.reference, out.empty() ? "no output" : out));
  }
  return result;
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
  } else {
    tokenizer = std::make_unique<tokenize::Tokenizer>(tokenize::Tokenizer::load(options.tokenizer));
  }
  std::vector<double> seconds;
  std::size_t ids = 0;
  for (std::int64_t r = 0; r < rounds; ++r)
    seconds.push_back(bench::time_once([&] { ids = tokenizer->encode(text).size(); }));
  const double ours = static_cast<double>(text.size()) / bench::median(seconds) / 1e6;
  nlohmann::json out = {{"bytes", text.size()},
                        {"ids", ids},
                        {"vocabulary", tokenizer->vocabulary()},
                        {"train_seconds", train_seconds},
                        {"megabytes_per_second", ours}};
  if (!options.reference.empty()) {
    const nlohmann::json reference = reference_speed(options, tokenizer->to_json(), text, rounds);
    out["reference_megabytes_per_second"] = reference["megabytes_per_second"];
    out["reference_ids"] = reference["ids"];
    out["ratio"] = ours / reference["megabytes_per_second"].get<double>();
  }
  if (options.json) {
    std::cout << out.dump() << '\n';
    return;
  }
  std::cout << fmt::format(
      "encode {} bytes of training text with {} tokens ({} ids): {:.1f} MB/s on one thread{}\n",
      text.size(), tokenizer->vocabulary(), ids, ours,
      options.tokenizer.empty() ? fmt::format(" (trained in {:.2f} s)", train_seconds) : "");
  if (out.contains("ratio")) {
    std::cout << fmt::format(
        "@huggingface/tokenizers (node): {:.2f} MB/s, {} ids: meshtensor {:.1f}x\n",
        out["reference_megabytes_per_second"].get<double>(),
        out["reference_ids"].get<std::int64_t>(), out["ratio"].get<double>());
  }
}

}  // namespace

void add_tokenize_bench(CLI::App& bench) {
  const auto options = std::make_shared<TokenizeBenchOptions>();
  CLI::App* command = bench.add_subcommand(
      "tokenize", "byte-level BPE: encode speed, and Hugging Face's JavaScript implementation's");
  command->add_option("--data", options->data, "the text (its training records)")
      ->capture_default_str();
  command->add_option("--tokenizer", options->tokenizer,
                      "a tokenizer.json (default: train one of --vocab tokens on the text)");
  command->add_option("--vocab", options->vocab, "tokens to train")->capture_default_str();
  command->add_option("--rounds", options->rounds, "timed encodes (median)")->capture_default_str();
  command->add_option("--reference", options->reference,
                      "a node_modules folder with @huggingface/tokenizers: time it too");
  add_flag(*command, "--json", options->json, "print one JSON object");
  command->callback([options] { run(*options); });
}

}  // namespace meshtensor::cli
