#pragma once

#include <functional>
#include <memory>
#include <string>

#include <meshtensor/checkpoint/checkpoint.hpp>
#include <meshtensor/comm/communicator.hpp>
#include <meshtensor/hf/hf_model.hpp>
#include <meshtensor/nn/models.hpp>
#include <meshtensor/tokenize/tokenizer.hpp>
#include <meshtensor/tp/tensor_parallel.hpp>

namespace meshtensor::generate {

/// What is wrong with a checkpoint's "architecture" metadata, or empty when it is a decoder
/// (nn::parse_decoder_architecture) whose parameter count is what the index's f32 "model.*"
/// tensors hold, and whose tokenizer is the byte tokenizer (vocabulary 256) or the byte-level BPE
/// of its "tokenizer" metadata, with the name (checksum) and vocabulary the architecture records.
/// Untrusted metadata is checked against the tensors this way before a model is built from it.
std::string architecture_problem(const checkpoint::Index& index);

/// The tokenizer of a checkpoint's model (its index passed architecture_problem()): the byte
/// tokenizer or the BPE its "tokenizer" metadata holds. DataError naming `path` otherwise.
tokenize::Tokenizer checkpoint_tokenizer(const checkpoint::Index& index, const std::string& path);

/// The decoder a checkpoint's index describes, once architecture_problem() found nothing; DataError
/// naming `path` and the problem otherwise.
nn::DecoderSpec checked_architecture(const checkpoint::Index& index, const std::string& path);

/// The decoder of the model `path` names: a meshtensor checkpoint (checked_architecture()) or a
/// Hugging Face folder "hf:DIR" (hf::read_folder()), read by this process; DataError naming it.
nn::DecoderSpec model_architecture(const std::string& path);

/// The tokenizer of the model `path` names (a checkpoint or "hf:DIR"), read by this process.
std::shared_ptr<const tokenize::Tokenizer> model_tokenizer(const std::string& path);

/// The blocks `requests` name from the model `path` names: checkpoint::load() (collective over
/// `world`) for a checkpoint, hf::load() for "hf:DIR" (each rank reads what its blocks need).
std::vector<Tensor> load_blocks(comm::Communicator& world, const std::string& path,
                                std::span<const checkpoint::LoadRequest> requests);

/// The same blocks read straight into `targets` (contiguous f32 tensors of the requests' block
/// shapes, one per request; a shard of a parameter, say), a batch of about 256 MiB of whole
/// tensors at a time: no copy of the whole model is held. Batches end at the same requests on
/// every rank (by whole shapes), so the collective reads of a checkpoint pair up; a Hugging Face
/// folder is read by each rank alone, and a rank's failure reaches every rank.
void load_blocks_into(comm::Communicator& world, const std::string& path,
                      std::span<const checkpoint::LoadRequest> requests, std::span<Tensor> targets);

/// The architecture of the checkpoint `path` on every rank of `world` (collective): rank 0 reads
/// the index, checks it (checked_architecture()) and `models_in_process` copies of the model
/// against the memory available (ResourceError), and broadcasts it.
nn::DecoderSpec read_architecture(comm::Communicator& world, const std::string& path,
                                  std::int64_t models_in_process = 1);

/// The decoder saved in the checkpoint `path` (a checkpoint directory or a root with LATEST, or
/// "hf:DIR") on every rank of `world` (collective), for generation or export (no gradients):
/// built from the checkpoint's architecture without drawing initial weights, given to `prepare`
/// (which may split it: each rank then reads only its blocks), and loaded from its
/// "model.<name>" tensors, whatever layout saved them, a batch of parameters at a time. The
/// architecture is checked against the tensors (checked_architecture()) and `models_in_process`
/// copies of the model against the memory available (ResourceError) before anything is
/// allocated. DataError naming the checkpoint for a checkpoint of another model (an MLP, another
/// architecture, a missing tensor).
std::unique_ptr<nn::Decoder> load_decoder(comm::Communicator& world, const std::string& path,
                                          std::int64_t models_in_process = 1,
                                          const std::function<void(nn::Decoder&)>& prepare = {});

/// Where a checkpoint path (a checkpoint directory or a root with LATEST) resolves: rank 0
/// reads the directory and its step, every rank of `world` gets both (collective; an error on
/// rank 0 is thrown on every rank).
struct CheckpointLocation {
  std::string directory;
  std::int64_t step = 0;
};
CheckpointLocation locate_checkpoint(comm::Communicator& world, const std::string& path);

/// The tensor-parallel group generation runs on: every rank of `world`, whose lifetime it must
/// not outlive, in `mode`, without sequence parallelism.
std::unique_ptr<tp::TensorParallel> generation_group(comm::Communicator& world,
                                                     comm::ReductionMode mode);

/// Splits `model` over `group` the way generation runs it (the Megatron plan without sequence
/// parallelism, tp::decoder_plan(.., false)) after checking that the group's size divides its
/// heads and widths (tp::check_decoder_degree); nothing on a group of one rank.
void parallelize_for_generation(nn::Decoder& model, tp::TensorParallel& group);

/// load_decoder(world, path, models_in_process) with exact sums in `mode` exact, split over `group`
/// by parallelize_for_generation: the one way a checkpoint becomes a model that generates.
std::unique_ptr<nn::Decoder> load_for_generation(comm::Communicator& world, const std::string& path,
                                                 tp::TensorParallel& group,
                                                 comm::ReductionMode mode,
                                                 std::int64_t models_in_process = 1);

/// Writes the model of `source` (a checkpoint or hf:DIR) as the Hugging Face folder `out`: the
/// architecture is checked against the format before any weight is read, then the model is read
/// on one rank and written by hf::export_folder.
hf::ExportReport export_hf(const std::string& source, const std::string& out,
                           const hf::ExportOptions& options);

}  // namespace meshtensor::generate
