#pragma once

#include <memory>
#include <string>

#include <meshtensor/comm/communicator.hpp>
#include <meshtensor/nn/gpt.hpp>

namespace meshtensor::generate {

/// The GPT a checkpoint's "architecture" metadata describes ("gpt layers=L heads=H dim=D
/// context=T vocabulary=V tokenizer=bytes", as `meshtensor train` writes it). DataError naming
/// the text when it is not a byte-level GPT.
nn::GptConfig parse_architecture(const std::string& text);

/// The GPT saved in the checkpoint `path` (a checkpoint directory or a root with LATEST), whole
/// on every rank of `world` (collective): built from the checkpoint's architecture and loaded
/// from its "model.<name>" tensors, whatever layout saved them. DataError naming the checkpoint
/// for a checkpoint of another model (an MLP, another architecture, a missing tensor).
std::unique_ptr<nn::Gpt> load_gpt(comm::Communicator& world, const std::string& path);

}  // namespace meshtensor::generate
