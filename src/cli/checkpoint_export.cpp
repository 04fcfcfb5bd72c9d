#include <iostream>
#include <map>

#include <fmt/format.h>

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

/// The model's parameters, whole, by name, and its tokenizer: read on one rank.
void export_model(const ExportOptions& options) {
  if (options.format != "hf")
    throw ParseError(fmt::format("--format '{}': the one export format is hf", options.format));
  hf::ExportOptions how;
  how.dtype = parse_dtype(options.dtype);
  how.shard_bytes = hf::parse_shard_size("--shard-size", options.shard_size);
  const NamedPath outputs[] = {{"OUT", options.out}};
  const NamedPath inputs[] = {
      {"CHECKPOINT", hf::folder_of(options.source).value_or(options.source)}};
  check_outputs_are_not_inputs({}, outputs, inputs);
  const hf::ExportReport report = generate::export_hf(options.source, options.out, how);
  std::cout << fmt::format(
      "exported {} as {} ({} tensors, {} of {}) to {}:", options.source, report.architecture,
      report.tensors, format_bytes(static_cast<double>(report.bytes)), options.dtype, options.out);
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
