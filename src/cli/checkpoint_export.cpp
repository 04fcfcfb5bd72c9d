#include <iostream>
#include <map>

#include <fmt/format.h>

#include <meshtensor/comm/threads_backend.hpp>
#include <meshtensor/core/error.hpp>
#include <meshtensor/core/memory.hpp>
#include <meshtensor/generate/load.hpp>
#include <meshtensor/hf/hf_model.hpp>

#include "commands.hpp"
#include "options.hpp"
#include "output_files.hpp"

namespace meshtensor::cli {

namespace {

struct ExportOptions {
  std::string format;
  std::string source;
  std::string out;
  std::string dtype = "f32";
  std::string shard_size = "2GB";
};

/// "2GB", "500MB", "4096" (bytes): decimal units as Hugging Face's max_shard_size, or binary
/// ones (KiB, MiB, GiB). ParseError naming the text.
std::int64_t parse_shard_size(const std::string& text) {
  const std::map<std::string, std::int64_t> units{{"", 1},
                                                  {"B", 1},
                                                  {"KB", 1000},
                                                  {"MB", 1000 * 1000},
                                                  {"GB", 1000000000},
                                                  {"KiB", 1 << 10},
                                                  {"MiB", 1 << 20},
                                                  {"GiB", std::int64_t{1} << 30}};
  std::size_t digits = 0;
  while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits])) != 0)
    ++digits;
  const auto unit = units.find(text.substr(digits));
  if (digits == 0 || digits > 12 || unit == units.end()) {
    throw ParseError(
        fmt::format("--shard-size '{}' is not a size such as 2GB, 500MB, 64MiB or 4096", text));
  }
  const std::int64_t size = std::stoll(text.substr(0, digits)) * unit->second;
  if (size < 1) throw ParseError(fmt::format("--shard-size '{}' is not positive", text));
  return size;
}

/// The model's parameters, whole, by name, and its tokenizer: read on one rank.
void export_model(const ExportOptions& options) {
  if (options.format != "hf")
    throw ParseError(fmt::format("--format '{}': the one export format is hf", options.format));
  hf::ExportOptions how;
  how.dtype = parse_dtype(options.dtype);
  how.shard_bytes = parse_shard_size(options.shard_size);
  const NamedPath outputs[] = {{"OUT", options.out}};
  const NamedPath inputs[] = {
      {"CHECKPOINT", hf::folder_of(options.source).value_or(options.source)}};
  check_outputs_are_not_inputs({}, outputs, inputs);
  const nn::DecoderConfig config = generate::model_architecture(options.source);
  hf::architecture_of(config);  // a model Hugging Face cannot express is refused before reading
  const std::shared_ptr<const tokenize::Tokenizer> tokenizer =
      generate::model_tokenizer(options.source);
  hf::ExportReport report;
  comm::run_threads(1, [&](comm::Communicator& world) {
    const std::unique_ptr<nn::Decoder> model = generate::load_decoder(world, options.source);
    std::map<std::string, Tensor> parameters;
    for (nn::Parameter* p : model->parameters())
      parameters.emplace(p->name, p->value);
    report = hf::export_folder(options.out, config, *tokenizer, parameters, how);
  });
  std::cout << fmt::format("exported {} as {} ({} tensors, {} of {}) to {}:", options.source,
                           hf::architecture_of(config), report.tensors,
                           format_bytes(static_cast<double>(report.bytes)), options.dtype,
                           options.out);
  for (const std::string& file : report.files)
    std::cout << ' ' << file;
  std::cout << '\n';
}

}  // namespace

void add_checkpoint_export(CLI::App& checkpoint_command) {
  const auto options = std::make_shared<ExportOptions>();
  CLI::App* command = checkpoint_command.add_subcommand(
      "export",
      "write a checkpoint's model as a Hugging Face folder (config.json, safetensors, "
      "tokenizer.json)");
  command->add_option("--format", options->format, "hf")->required();
  command
      ->add_option("CHECKPOINT", options->source, "checkpoint (or a root with LATEST), or hf:DIR")
      ->required();
  command->add_option("OUT", options->out, "the folder to write")->required();
  command->add_option("--dtype", options->dtype, "f32, bf16 or f16")->capture_default_str();
  command
      ->add_option("--shard-size", options->shard_size,
                   "most tensor bytes in one safetensors file (2GB, 500MB, 64MiB, ...)")
      ->capture_default_str();
  command->callback([options] { export_model(*options); });
}

}  // namespace meshtensor::cli
