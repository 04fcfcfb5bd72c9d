#include "train_options.hpp"

#include <fmt/format.h>

#include <meshtensor/comm/threads_backend.hpp>
#include <meshtensor/core/error.hpp>
#include <meshtensor/generate/load.hpp>
#include <meshtensor/nn/models.hpp>
#include <meshtensor/train/text_data.hpp>

namespace meshtensor::cli {

train::TrainSettings train_settings(const TrainOptions& options) {
  train::TrainSettings settings;
  for (const auto& [name, text] : options.defaults)
    settings.set_default(name, text);
  options.settings.apply_to(settings);
  if (options.settings.given("reshard_after_forward") && options.no_reshard_after_forward)
    throw ParseError("--reshard-after-forward and --no-reshard-after-forward exclude each other");
  if (options.no_reshard_after_forward) settings.set("reshard_after_forward", "false");
  if (options.no_sample) settings.set("sample", "false");
  if (!options.trace.empty()) settings.set("trace", "true");
  return settings;
}

bool trains_language(const TrainOptions& options) {
  return nn::is_decoder_model(options.model) || options.settings.given("init");
}

train::TrainConfig parse_config(const TrainOptions& options) {
  return train_settings(options).config(trains_language(options));
}

std::int64_t layout_ranks(const TrainOptions& options, const train::TrainSettings& settings) {
  return mesh_or_ranks(options.ranks, options.ranks_option, settings.mesh_ranks(),
                       options.settings.value("mesh"));
}

std::string strategy_text(const TrainOptions& options) {
  if (options.settings.given("strategy")) return options.settings.value("strategy");
  return options.settings.given("mesh") ? "hsdp"
                                        : (options.replica_groups.groups > 0 ? "fsdp" : "ddp");
}

/// The decoder and tokenizer of `init` (a checkpoint or hf:DIR), which --model and --tokenizer
/// must leave alone.
std::pair<nn::DecoderSpec, std::shared_ptr<const tokenize::Tokenizer>> init_model(
    const TrainOptions& options, const std::string& init) {
  if ((options.model_option != nullptr && options.model_option->count() > 0) ||
      !options.tokenizer.empty()) {
    throw ParseError(
        fmt::format("--init {} brings its own model and tokenizer; --model and "
                    "--tokenizer do not apply",
                    init));
  }
  return {generate::model_architecture(init), generate::model_tokenizer(init)};
}

/// --seq-len, or 0.
std::int64_t window(const TrainOptions& options) {
  const std::string given = options.settings.value("seq_len");
  return given.empty() ? 0 : integer_setting("--seq-len", given, 1, std::int64_t{1} << 20);
}

LoadedTask load_task(const TrainOptions& options) {
  LoadedTask loaded;
  const std::string init = options.settings.given("init") ? options.settings.value("init") : "";
  if (!init.empty()) {
    auto [decoder, tokenizer] = init_model(options, init);
    loaded.data = options.data.empty() ? train::kDefaultTextDir : options.data;
    auto corpus = std::make_shared<const train::TextCorpus>(train::load_text(loaded.data));
    loaded.task = std::make_unique<train::LanguageModelling>(std::move(corpus), std::move(decoder),
                                                             std::move(tokenizer), window(options));
    loaded.language = true;
    return loaded;
  }
  if (nn::is_decoder_model(options.model)) {
    const nn::DecoderSpec decoder = nn::parse_decoder_spec(options.model);
    if ((options.activation_option != nullptr && options.activation_option->count() > 0) ||
        options.layernorm) {
      throw ParseError(fmt::format(
          "--activation and --layernorm shape an mlp; model {} has its own activation and norms",
          options.model));
    }
    loaded.data = options.data.empty() ? train::kDefaultTextDir : options.data;
    auto corpus = std::make_shared<const train::TextCorpus>(train::load_text(loaded.data));
    std::shared_ptr<const tokenize::Tokenizer> tokenizer;
    if (!options.tokenizer.empty()) {
      tokenizer =
          std::make_shared<const tokenize::Tokenizer>(tokenize::Tokenizer::load(options.tokenizer));
    }
    loaded.task = std::make_unique<train::LanguageModelling>(
        std::move(corpus),
        tokenizer ? nn::with_vocabulary(decoder, tokenizer->vocabulary()) : decoder, tokenizer,
        window(options));
    loaded.language = true;
    return loaded;
  }
  if (!options.tokenizer.empty()) {
    throw ParseError(
        fmt::format("--tokenizer {} tokenizes text for a decoder; model {} reads images",
                    options.tokenizer, options.model));
  }
  nn::MlpConfig mlp;
  mlp.hidden = nn::parse_mlp_hidden(options.model);
  mlp.activation = nn::parse_activation(options.activation);
  mlp.layernorm = options.layernorm;
  loaded.data = options.data.empty() ? train::kDefaultDataDir : options.data;
  loaded.images = std::make_unique<train::Dataset>(train::load_dataset(loaded.data));
  loaded.task = std::make_unique<train::ImageClassification>(*loaded.images, mlp);
  return loaded;
}

/// Registers the options `meshtensor train` and `meshtensor bench train` share, with the same
/// meaning and defaults.
void add_shared_train_options(CLI::App& command, TrainOptions& options) {
  command.add_option("--data", options.data,
                     "mlp: directory of the four IDX files (default Fashion-MNIST); gpt: a UTF-8 "
                     "text file or directory of them (default Debian's fortunes)");
  options.model_option = command.add_option(
      "--model", options.model,
      "mlp:H1,H2,... hidden sizes (default mlp:1024,1024); gpt / "
      "gpt:layers=L,heads=H,dim=D,context=T (any of the keys; default " +
          nn::gpt_config_text(nn::GptConfig{}) +
          "); or llama / llama:layers=L,heads=H,kv_heads=K,dim=D,ffn=F,context=T,"
          "rope_theta=R,norm_eps=E,qk_norm=0|1,tie=0|1 (default " +
          nn::llama_config_text(nn::DecoderSpec{}) + ")");
  command.add_option("--tokenizer", options.tokenizer,
                     "gpt/llama: a byte-level BPE tokenizer.json (`meshtensor tokenizer train`); "
                     "the model's vocabulary is its (default: bytes, 256 tokens)");
  options.settings.add_to(command, train::TrainSettings::table(),
                          {"batch", "seq_len", "optimizer", "lr", "seed"});
  options.timeout.add_to(command);
}

void add_timed_train_options(CLI::App& command, TrainOptions& options, const std::string& steps) {
  options.defaults["steps"] = steps;
  add_shared_train_options(command, options);
  options.settings.add_to(command, train::TrainSettings::table(), {"steps", "epochs"},
                          {{"steps", fmt::format("timed steps (default {})", steps)},
                           {"epochs", "whole epochs instead of `steps`"}});
}

}  // namespace meshtensor::cli
