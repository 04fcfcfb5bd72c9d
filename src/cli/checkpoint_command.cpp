#include <iostream>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <meshtensor/checkpoint/checkpoint.hpp>
#include <meshtensor/checkpoint/safetensors.hpp>
#include <meshtensor/core/memory.hpp>
#include <meshtensor/generate/load.hpp>

#include "commands.hpp"
#include "options.hpp"

namespace meshtensor::cli {

namespace {

struct CheckpointOptions {
  std::string path;
  bool json = false;
};

std::string offset_text(const std::vector<std::int64_t>& offset) {
  return fmt::format("[{}]", fmt::join(offset, ", "));
}

void inspect(const CheckpointOptions& options) {
  const std::string directory = checkpoint::resolve(options.path);
  const checkpoint::Index index = checkpoint::read_index(directory);
  // The listing is only worth reading when the files hold what the index says (headers only).
  const std::vector<std::string> problems = checkpoint::reconcile(directory, index);
  if (!problems.empty()) set_exit_status(1);
  std::int64_t total_bytes = 0;
  for (const auto& [file, bytes] : index.files)
    total_bytes += bytes;
  if (options.json) {
    nlohmann::json tensors = nlohmann::json::array();
    for (const checkpoint::StoredTensor& tensor : index.tensors) {
      nlohmann::json blocks = nlohmann::json::array();
      for (const checkpoint::StoredBlock& block : tensor.blocks) {
        blocks.push_back({{"file", block.file},
                          {"offset", block.offset},
                          {"shape", block.shape.dims()},
                          {"bytes", block.end - block.begin}});
      }
      tensors.push_back({{"name", tensor.name},
                         {"dtype", checkpoint::safetensors_dtype_name(tensor.dtype)},
                         {"shape", tensor.shape.dims()},
                         {"bytes", tensor.nbytes()},
                         {"blocks", blocks}});
    }
    const nlohmann::json out = {
        {"directory", directory},     {"step", index.step},     {"world_size", index.world_size},
        {"metadata", index.metadata}, {"files", index.files},   {"file_bytes", total_bytes},
        {"tensors", tensors},         {"ok", problems.empty()}, {"problems", problems}};
    std::cout << out.dump(1) << '\n';
    return;
  }
  std::cout << fmt::format("checkpoint {}: step {}, saved by {} rank(s), {} file(s), {}\n",
                           directory, index.step, index.world_size, index.files.size(),
                           format_bytes(static_cast<double>(total_bytes)));
  for (const auto& [key, value] : index.metadata) {
    // A long or multi-line value (a tokenizer.json) is left to --json.
    if (value.size() > 200 || value.find('\n') != std::string::npos) {
      std::cout << fmt::format("  {}: {} bytes of text (--json shows them)\n", key, value.size());
    } else {
      std::cout << fmt::format("  {}: {}\n", key, value);
    }
  }
  std::size_t width = 6;
  for (const auto& tensor : index.tensors)
    width = std::max(width, tensor.name.size());
  std::cout << fmt::format("{:<{}}  {:<5}  {:<14}  {:>6}  {:>12}\n", "tensor", width, "dtype",
                           "shape", "blocks", "bytes");
  for (const auto& tensor : index.tensors) {
    std::cout << fmt::format("{:<{}}  {:<5}  {:<14}  {:>6}  {:>12}\n", tensor.name, width,
                             checkpoint::safetensors_dtype_name(tensor.dtype),
                             offset_text(tensor.shape.dims()), tensor.blocks.size(),
                             tensor.nbytes());
    for (const auto& block : tensor.blocks) {
      std::cout << fmt::format("    {} at {} in {} ({} bytes)\n", offset_text(block.shape.dims()),
                               offset_text(block.offset), block.file, block.end - block.begin);
    }
  }
  for (const std::string& problem : problems)
    std::cout << "FAILED: " << problem << '\n';
  if (!problems.empty())
    std::cout << fmt::format("{} problem(s) in {}\n", problems.size(), directory);
}

/// The problem of a decoder checkpoint whose architecture metadata does not describe its tensors.
std::vector<std::string> architecture_problems(const std::string& directory) {
  const checkpoint::Index index = checkpoint::read_index(directory);
  const auto found = index.metadata.find("architecture");
  if (found == index.metadata.end() ||
      (found->second.rfind("gpt ", 0) != 0 && found->second.rfind("llama ", 0) != 0))
    return {};
  const std::string problem = generate::architecture_problem(index);
  if (problem.empty()) return {};
  return {fmt::format("{}: {}", directory, problem)};
}

void verify(const CheckpointOptions& options) {
  checkpoint::VerifyReport report = checkpoint::verify(options.path);
  for (std::string& problem : architecture_problems(report.directory))
    report.problems.push_back(std::move(problem));
  if (options.json) {
    const nlohmann::json out = {{"directory", report.directory}, {"ok", report.problems.empty()},
                                {"files", report.files},         {"blocks", report.blocks},
                                {"bytes", report.bytes},         {"problems", report.problems}};
    std::cout << out.dump(1) << '\n';
  } else if (report.problems.empty()) {
    std::cout << fmt::format("OK: {} file(s), {} block(s), {} checked in {}\n", report.files,
                             report.blocks, format_bytes(static_cast<double>(report.bytes)),
                             report.directory);
  } else {
    for (const std::string& problem : report.problems)
      std::cout << "FAILED: " << problem << '\n';
    std::cout << fmt::format("{} problem(s) in {}\n", report.problems.size(), report.directory);
  }
  if (!report.problems.empty()) set_exit_status(1);
}

}  // namespace

void add_checkpoint_command(CLI::App& app) {
  CLI::App* command =
      app.add_subcommand("checkpoint", "inspect, verify and export saved checkpoints");
  command->require_subcommand(1);
  const auto options = std::make_shared<CheckpointOptions>();
  CLI::App* inspect_command = command->add_subcommand(
      "inspect", "list the tensors of a checkpoint: shapes, dtypes, blocks and bytes");
  inspect_command->add_option("dir", options->path, "checkpoint (or a root with LATEST)")
      ->required();
  add_flag(*inspect_command, "--json", options->json, "print one JSON object");
  inspect_command->callback([options] { inspect(*options); });
  CLI::App* verify_command = command->add_subcommand(
      "verify", "check every file against the index and every block against its checksum");
  verify_command->add_option("dir", options->path, "checkpoint (or a root with LATEST)")
      ->required();
  add_flag(*verify_command, "--json", options->json, "print one JSON object");
  verify_command->callback([options] { verify(*options); });
  add_checkpoint_export(*command);
}

}  // namespace meshtensor::cli
