#pragma once

#include <span>
#include <string>
#include <vector>

#include <meshtensor/checkpoint/checkpoint.hpp>
#include <meshtensor/fsdp/sharded_model.hpp>
#include <meshtensor/nn/optim.hpp>

namespace meshtensor::train {

/// The checkpoint blocks of a sharded model as this rank holds them: every parameter shard as
/// "model.<name>" and, with an optimizer made on sharded.optimizer_slots(), its per-slot state as
/// "optimizer.<name>.<state>" (sharded like the parameter) and its scalars as "optimizer.<scalar>"
/// (f64 scalars). The first replica of each shard owns its blocks, `leader` the scalars. The
/// blocks view the live state: a save reads them, restore_model_state() writes them. `prefix`
/// replaces "model." (e.g. a frozen reference model saved beside the trained one).
std::vector<checkpoint::SaveItem> model_state(fsdp::ShardedModel& sharded, nn::Optimizer* optimizer,
                                              bool leader, const std::string& prefix = "model.");

/// The load requests matching `items` (same names, shapes and blocks).
std::vector<checkpoint::LoadRequest> load_requests(std::span<const checkpoint::SaveItem> items);

/// Puts what checkpoint::load returned for load_requests(items) back: block data is copied into
/// the items' tensors and optimizer scalars ("optimizer.<scalar>", rank 0) go to `optimizer`.
void restore_model_state(std::span<const checkpoint::SaveItem> items,
                         std::span<const Tensor> loaded, nn::Optimizer* optimizer);

/// Reads the "model.*" tensors of `path` (a checkpoint or "hf:DIR") straight into the shards of
/// `sharded` (generate::load_blocks_into): no rank holds the whole model. Collective over
/// `world`, the ranks of `sharded`'s mesh.
void read_model_weights(comm::Communicator& world, const std::string& path,
                        fsdp::ShardedModel& sharded);

}  // namespace meshtensor::train
