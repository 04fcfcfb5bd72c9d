#include <chrono>
#include <iostream>
#include <iterator>
#include <limits>
#include <memory>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <meshtensor/core/error.hpp>
#include <meshtensor/core/file.hpp>
#include <meshtensor/core/setting_text.hpp>
#include <meshtensor/core/untrusted_json.hpp>
#include <meshtensor/tokenize/bpe_trainer.hpp>
#include <meshtensor/tokenize/tokenizer.hpp>
#include <meshtensor/train/text_data.hpp>

#include "commands.hpp"
#include "options.hpp"
#include "output_files.hpp"

namespace meshtensor::cli {

namespace {

/// Most bytes `tokenizer encode` and `decode` read from standard input.
constexpr std::size_t kMaxInputBytes = std::size_t{1} << 30;

struct TokenizerOptions {
  std::string tokenizer;
  bool json = false;
  bool no_special_tokens = false;
  bool skip_special_tokens = false;
  std::string encoder;
  std::string merges;
  std::string model;
  bool hugging_face = false;
  std::string out;
  std::string data = train::kDefaultTextDir;
  std::string vocabulary;  // --vocab as given: decimal digits only
  tokenize::BpeTrainerConfig trainer;
};

/// All of standard input; DataError past kMaxInputBytes.
std::string read_input() {
  return read_standard_input(kMaxInputBytes, "a tokenizer");
}

/// The ids are written as they are made: the output is never held whole. The post-processor's
/// special tokens (Llama's bos) come first and last, as Hugging Face's encode() adds them.
void encode(const TokenizerOptions& options) {
  const auto tokenizer = tokenize::Tokenizer::load(options.tokenizer);
  const std::string text = read_input();
  std::string line = options.json ? "[" : "";
  bool first = true;
  const auto write = [&](std::span<const std::int64_t> ids) {
    for (const std::int64_t id : ids) {
      if (!first) line += options.json ? "," : " ";
      first = false;
      fmt::format_to(std::back_inserter(line), "{}", id);
    }
    std::cout << line;
    line.clear();
  };
  const auto& specials = tokenizer.post_processor();
  if (!options.no_special_tokens) write(specials.before());
  tokenizer.encode_each(text, write);
  if (!options.no_special_tokens) write(specials.after());
  std::cout << line << (options.json ? "]\n" : "\n");
}

/// The text `encode` read: the post-processor's tokens around the ids are dropped.
void decode(const TokenizerOptions& options) {
  const auto tokenizer = tokenize::Tokenizer::load(options.tokenizer);
  const std::vector<std::int64_t> ids = tokenize::parse_ids(read_input(), "standard input");
  const std::string bytes =
      tokenizer.decode_text(tokenizer.post_processor().inner(ids), options.skip_special_tokens);
  std::cout.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

void from_gpt2(const TokenizerOptions& options) {
  const std::vector<NamedPath> outputs{{"--out", options.out}};
  const std::vector<NamedPath> inputs{{"--encoder", options.encoder}, {"--merges", options.merges}};
  check_outputs_are_not_inputs(outputs, {}, inputs);
  const auto tokenizer = tokenize::Tokenizer::from_gpt2(
      read_regular_file(options.encoder, std::int64_t{256} << 20, "an encoder.json"),
      read_regular_file(options.merges, std::int64_t{256} << 20, "a vocab.bpe"), options.encoder);
  OutputFile out("--out", options.out);
  out.stream() << tokenizer.to_json() << '\n';
  out.commit();
  std::cout << fmt::format("wrote {}: {} tokens\n", options.out, tokenizer.vocabulary());
}

/// The tokenizer.json of a SentencePiece model: meshtensor reads it back as the model itself.
void from_sentencepiece(const TokenizerOptions& options) {
  const std::vector<NamedPath> outputs{{"--out", options.out}};
  const std::vector<NamedPath> inputs{{"--model", options.model}};
  check_outputs_are_not_inputs(outputs, {}, inputs);
  const auto tokenizer = tokenize::Tokenizer::from_sentencepiece(
      read_regular_file(options.model, std::int64_t{256} << 20, "a SentencePiece model"),
      options.model);
  OutputFile out("--out", options.out);
  out.stream() << (options.hugging_face ? tokenizer.to_hugging_face_json() : tokenizer.to_json())
               << '\n';
  out.commit();
  std::cout << fmt::format("wrote {}: {} tokens\n", options.out, tokenizer.vocabulary());
}

/// Trains on the training records of the text `train` reads from the same path, so a model's
/// validation text is text the tokenizer never saw.
void train_tokenizer(TokenizerOptions options) {
  const std::vector<NamedPath> outputs{{"--out", options.out}};
  const std::vector<NamedPath> inputs{{"--data", options.data}};
  check_outputs_are_not_inputs(outputs, {}, inputs);
  if (!options.vocabulary.empty()) {
    options.trainer.vocabulary =
        integer_setting("--vocab", options.vocabulary, 1, std::numeric_limits<std::int64_t>::max());
  }
  tokenize::check_trainer_config(options.trainer);
  tokenize::pattern_of(options.trainer.pattern);
  const train::TextCorpus corpus = train::load_text(options.data);
  const auto start = std::chrono::steady_clock::now();
  tokenize::BpeTrainerReport report;
  const auto tokenizer = tokenize::train_bpe(corpus.train, options.trainer, &report);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  OutputFile out("--out", options.out);
  out.stream() << tokenizer.to_json() << '\n';
  out.commit();
  std::cout << fmt::format(
      "trained {} tokens ({} merges, {} special) on {} bytes of training text ({} records of {} "
      "files; {} pieces, {} distinct) in {:.2f} s\n",
      tokenizer.vocabulary(), report.merges, options.trainer.special_tokens.size(),
      corpus.train.size(), corpus.records, corpus.files, report.pieces, report.distinct_pieces,
      seconds);
  if (report.exhausted) {
    std::cout << fmt::format("stopped below the {} tokens asked: no pair occurs twice any more\n",
                             options.trainer.vocabulary);
  }
  std::cout << fmt::format("wrote {}\n", options.out);
}

}  // namespace

void add_tokenizer_command(CLI::App& app) {
  CLI::App* command = app.add_subcommand("tokenizer", "BPE tokenizers (tokenizer.json)");
  command->require_subcommand(1);
  const auto options = std::make_shared<TokenizerOptions>();
  CLI::App* encode_command =
      command->add_subcommand("encode", "print the token ids of all of standard input");
  encode_command
      ->add_option("--tokenizer", options->tokenizer, "a tokenizer.json or SentencePiece .model")
      ->required();
  add_flag(*encode_command, "--json", options->json, "print one JSON array");
  add_flag(*encode_command, "--no-special-tokens", options->no_special_tokens,
           "without the special tokens the post-processor adds (a bos)");
  encode_command->callback([options] { encode(*options); });
  CLI::App* decode_command = command->add_subcommand(
      "decode", "write the bytes of the token ids on standard input (JSON or between spaces)");
  decode_command
      ->add_option("--tokenizer", options->tokenizer, "a tokenizer.json or SentencePiece .model")
      ->required();
  add_flag(*decode_command, "--skip-special-tokens", options->skip_special_tokens,
           "drop every special added token");
  decode_command->callback([options] { decode(*options); });
  CLI::App* gpt2_command = command->add_subcommand(
      "from-gpt2", "write the tokenizer.json of GPT-2's encoder.json and vocab.bpe");
  gpt2_command->add_option("--encoder", options->encoder, "encoder.json")->required();
  gpt2_command->add_option("--merges", options->merges, "vocab.bpe")->required();
  gpt2_command->add_option("--out", options->out, "the tokenizer.json to write")->required();
  gpt2_command->callback([options] { from_gpt2(*options); });
  CLI::App* spm_command = command->add_subcommand(
      "from-sentencepiece", "write the tokenizer.json of a SentencePiece BPE model (.model)");
  spm_command->add_option("--model", options->model, "the .model file")->required();
  spm_command->add_option("--out", options->out, "the tokenizer.json to write")->required();
  add_flag(*spm_command, "--hugging-face", options->hugging_face,
           "without the model itself: the converter's file, as Hugging Face reads it");
  spm_command->callback([options] { from_sentencepiece(*options); });
  CLI::App* train_command = command->add_subcommand(
      "train", "learn byte-level BPE merges from the training records of a text");
  train_command->add_option("--data", options->data, "a UTF-8 text file or a directory of them")
      ->capture_default_str();
  train_command->add_option("--vocab", options->vocabulary, "tokens in all (decimal)")
      ->default_str(std::to_string(options->trainer.vocabulary));
  train_command->add_option("--pattern", options->trainer.pattern, "pre-tokenizer: gpt2|llama3")
      ->capture_default_str();
  // One token a --special, taken verbatim: "[SEP]" is the token [SEP], not a list.
  train_command
      ->add_option("--special", options->trainer.special_tokens,
                   "special tokens, given the last ids (repeat the option for more)")
      ->allow_extra_args(false)
      ->capture_default_str();
  train_command->add_option("--out", options->out, "the tokenizer.json to write")->required();
  train_command->callback([options] { train_tokenizer(*options); });
}

}  // namespace meshtensor::cli
