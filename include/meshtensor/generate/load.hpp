#pragma once

#include <memory>
#include <string>

#include <meshtensor/checkpoint/checkpoint.hpp>
#include <meshtensor/comm/communicator.hpp>
#include <meshtensor/nn/gpt.hpp>

namespace meshtensor::generate {

/// The "architecture" metadata of a byte-level GPT of `config`, as `meshtensor train` writes it
/// and parse_architecture() reads it.
std::string architecture_text(const nn::GptConfig& config);

/// The GPT a checkpoint's "architecture" metadata describes ("gpt layers=L heads=H dim=D
/// context=T vocabulary=V tokenizer=bytes", as `meshtensor train` writes it). DataError naming
/// the text when it is not a byte-level GPT.
nn::GptConfig parse_architecture(const std::string& text);

/// What is wrong with a checkpoint's "architecture" metadata, or empty when it is a byte-level
/// GPT whose parameter count is what the index's f32 "model.*" tensors hold. Untrusted metadata
/// is checked against the tensors this way before a model is built from it.
std::string architecture_problem(const checkpoint::Index& index);

/// The GPT a checkpoint's index describes, once architecture_problem() found nothing; DataError
/// naming `path` and the problem otherwise.
nn::GptConfig checked_architecture(const checkpoint::Index& index, const std::string& path);

/// The architecture of the checkpoint `path` on every rank of `world` (collective): rank 0 reads
/// the index, checks it (checked_architecture()) and `models_in_process` copies of the model
/// against the memory available (ResourceError), and broadcasts it.
nn::GptConfig read_architecture(comm::Communicator& world, const std::string& path,
                                std::int64_t models_in_process = 1);

/// The GPT saved in the checkpoint `path` (a checkpoint directory or a root with LATEST), whole
/// on every rank of `world` (collective): built from the checkpoint's architecture and loaded
/// from its "model.<name>" tensors, whatever layout saved them. The architecture is checked
/// against the tensors (checked_architecture()) and `models_in_process` copies of the model
/// against the memory available (ResourceError) before anything is allocated. DataError naming
/// the checkpoint for a checkpoint of another model (an MLP, another architecture, a missing
/// tensor).
std::unique_ptr<nn::Gpt> load_gpt(comm::Communicator& world, const std::string& path,
                                  std::int64_t models_in_process = 1);

}  // namespace meshtensor::generate
