#include <iostream>
#include <limits>
#include <memory>

#include <fmt/format.h>

#include <meshtensor/core/file.hpp>
#include <meshtensor/core/setting_text.hpp>
#include <meshtensor/tokenize/bpe_trainer.hpp>
#include <meshtensor/tokenize/tokenizer.hpp>
#include <meshtensor/train/text_data.hpp>

#include "commands.hpp"
#include "options.hpp"
#include "output_files.hpp"

namespace meshtensor::cli {

namespace {

/// Most bytes `tokenizer encode` and `decode` read from standard input (DataError past it).
constexpr std::size_t kMaxInputBytes = std::size_t{1} << 30;

struct TokenizerOptions {
  std::string tokenizer;
  bool json = false;
  bool no_special_tokens = false;
  bool skip_special_tokens = false;
  std::string encoder;
  std::string merges;
  std::string model;
  std::string ranks;
  std::string encoding = "cl100k_base";
  std::string pattern;
  std::vector<std::string> specials;
  bool hugging_face = false;
  std::string out;
  std::string data = train::kDefaultTextDir;
  std::string vocabulary;  // --vocab as given: decimal digits only
  tokenize::BpeTrainerConfig trainer;
};

void encode(const TokenizerOptions& options) {
  tokenize::write_ids(std::cout, tokenize::Tokenizer::load(options.tokenizer),
                      read_standard_input(kMaxInputBytes, "a tokenizer"),
                      {options.json, !options.no_special_tokens});
}

/// The text `encode` read: the post-processor's tokens around the ids are dropped.
void decode(const TokenizerOptions& options) {
  const auto tokenizer = tokenize::Tokenizer::load(options.tokenizer);
  const std::vector<std::int64_t> ids =
      tokenize::parse_ids(read_standard_input(kMaxInputBytes, "a tokenizer"), "standard input");
  const std::string bytes =
      tokenizer.decode_text(tokenizer.post_processor().inner(ids), options.skip_special_tokens);
  std::cout.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

/// Writes the tokenizer `convert` makes of the files `inputs` name to --out (never one of them).
template <class Convert>
void convert_files(const TokenizerOptions& options, const std::vector<NamedPath>& inputs,
                   const Convert& convert) {
  check_outputs_are_not_inputs(std::vector<NamedPath>{{"--out", options.out}}, {}, inputs);
  const tokenize::Tokenizer tokenizer = convert();
  OutputFile out("--out", options.out);
  out.stream() << (options.hugging_face ? tokenizer.to_hugging_face_json() : tokenizer.to_json())
               << '\n';
  out.commit();
  std::cout << fmt::format("wrote {}: {} tokens\n", options.out, tokenizer.vocabulary());
}

/// Trains on the training records of the text `train` reads from the same path, so a model's
/// validation text is text the tokenizer never saw.
void train_tokenizer(TokenizerOptions options) {
  check_outputs_are_not_inputs(std::vector<NamedPath>{{"--out", options.out}}, {},
                               std::vector<NamedPath>{{"--data", options.data}});
  if (!options.vocabulary.empty()) {
    options.trainer.vocabulary =
        integer_setting("--vocab", options.vocabulary, 1, std::numeric_limits<std::int64_t>::max());
  }
  tokenize::check_trainer_config(options.trainer);
  tokenize::pattern_of(options.trainer.pattern);
  const train::TextCorpus corpus = train::load_text(options.data);
  tokenize::BpeTrainerReport report;
  const auto tokenizer = tokenize::train_bpe(corpus.train, options.trainer, &report);
  OutputFile out("--out", options.out);
  out.stream() << tokenizer.to_json() << '\n';
  out.commit();
  std::cout << fmt::format(
      "trained {} tokens ({} merges, {} special) on {} bytes of training text ({} records of {} "
      "files; {} pieces, {} distinct) in {:.2f} s\n",
      tokenizer.vocabulary(), report.merges, options.trainer.special_tokens.size(),
      corpus.train.size(), corpus.records, corpus.files, report.pieces, report.distinct_pieces,
      report.seconds);
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
  gpt2_command->callback([options] {
    convert_files(*options, {{"--encoder", options->encoder}, {"--merges", options->merges}}, [&] {
      return tokenize::Tokenizer::load_gpt2(options->encoder, options->merges);
    });
  });
  CLI::App* spm_command = command->add_subcommand(
      "from-sentencepiece", "write the tokenizer.json of a SentencePiece BPE model (.model)");
  spm_command->add_option("--model", options->model, "the .model file")->required();
  spm_command->add_option("--out", options->out, "the tokenizer.json to write")->required();
  add_flag(*spm_command, "--hugging-face", options->hugging_face,
           "without the model itself: the converter's file, as Hugging Face reads it");
  spm_command->callback([options] {
    convert_files(*options, {{"--model", options->model}},
                  [&] { return tokenize::Tokenizer::load_sentencepiece(options->model); });
  });
  CLI::App* tiktoken_command = command->add_subcommand(
      "from-tiktoken", "write the tokenizer.json of a tiktoken rank file (cl100k, Llama 3's)");
  tiktoken_command->add_option("--ranks", options->ranks, "the rank file")->required();
  tiktoken_command->add_option("--encoding", options->encoding, tokenize::tiktoken_encoding_names())
      ->capture_default_str();
  tiktoken_command->add_option("--pattern", options->pattern, "a pre-tokenizer regex instead");
  tiktoken_command->add_option("--special", options->specials, "TEXT=ID, one more or instead")
      ->allow_extra_args(false);
  tiktoken_command->add_option("--out", options->out, "the tokenizer.json to write")->required();
  tiktoken_command->callback([options] {
    tokenize::TiktokenEncoding encoding = tokenize::tiktoken_encoding(options->encoding);
    if (!options->pattern.empty()) encoding.pattern = options->pattern;
    for (const std::string& special : options->specials)
      tokenize::set_special_token(encoding, special);
    convert_files(*options, {{"--ranks", options->ranks}},
                  [&] { return tokenize::Tokenizer::load_tiktoken(options->ranks, encoding); });
  });
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
