#include <string>

#include <meshtensor/generate/load.hpp>
#include <meshtensor/train/model_state.hpp>

namespace meshtensor::train {

namespace {
constexpr std::string_view kOptimizerPrefix = "optimizer.";

bool is_optimizer_scalar(const checkpoint::SaveItem& item) {
  return item.name.starts_with(kOptimizerPrefix) && item.global_shape.rank() == 0;
}
}  // namespace

std::vector<checkpoint::SaveItem> model_state(fsdp::ShardedModel& sharded, nn::Optimizer* optimizer,
                                              bool leader, const std::string& prefix) {
  std::vector<checkpoint::SaveItem> items;
  std::size_t slot = 0;
  for (const auto& module : sharded.modules()) {
    for (std::size_t p = 0; p < module->parameters().size(); ++p, ++slot) {
      const nn::Parameter& parameter = *module->parameters()[p];
      const std::string& name = parameter.name;
      // The shard's place in the parameter this rank holds, then that block's in the whole one
      // (a tensor-parallel split).
      const Shape shape = parameter.split.global_shape.rank() > 0 ? parameter.split.global_shape
                                                                  : module->layout().shape(p);
      std::vector<std::int64_t> offset = module->local_block(p).global_offset;
      if (offset.empty()) offset.assign(static_cast<std::size_t>(shape.rank()), 0);
      for (std::size_t d = 0; d < parameter.split.offset.size(); ++d)
        offset[d] += parameter.split.offset[d];
      const bool owner = module->is_first_replica() && parameter.split.saves;
      items.push_back({prefix + name, shape, offset, module->local_shard(p), owner});
      if (optimizer == nullptr) continue;
      for (const auto& [state, tensor] : optimizer->slot_state(slot)) {
        items.push_back(
            {std::string(kOptimizerPrefix) + name + "." + state, shape, offset, tensor, owner});
      }
    }
  }
  if (optimizer != nullptr) {
    for (const auto& [name, value] : optimizer->scalar_state()) {
      items.push_back({std::string(kOptimizerPrefix) + name,
                       Shape{},
                       {},
                       Tensor::full(Shape{}, DType::f64, value),
                       leader});
    }
  }
  return items;
}

std::vector<checkpoint::LoadRequest> load_requests(std::span<const checkpoint::SaveItem> items) {
  std::vector<checkpoint::LoadRequest> requests;
  requests.reserve(items.size());
  for (const checkpoint::SaveItem& item : items) {
    requests.push_back({item.name, item.global_shape, item.data.dtype(), item.offset,
                        item.data.shape(), item.owner});
  }
  return requests;
}

void restore_model_state(std::span<const checkpoint::SaveItem> items,
                         std::span<const Tensor> loaded, nn::Optimizer* optimizer) {
  std::vector<std::pair<std::string, double>> optimizer_scalars;
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (is_optimizer_scalar(items[i])) {
      optimizer_scalars.emplace_back(items[i].name.substr(kOptimizerPrefix.size()),
                                     loaded[i].values<double>()[0]);
    } else {
      Tensor target = items[i].data;
      target.copy_from(loaded[i]);
    }
  }
  if (optimizer != nullptr) optimizer->set_scalar_state(optimizer_scalars);
}

void read_model_weights(comm::Communicator& world, const std::string& path,
                        fsdp::ShardedModel& sharded) {
  const std::vector<checkpoint::SaveItem> items = model_state(sharded, nullptr, world.rank() == 0);
  std::vector<Tensor> targets;
  for (const checkpoint::SaveItem& item : items)
    targets.push_back(item.data);
  generate::load_blocks_into(world, path, load_requests(items), targets);
}

}  // namespace meshtensor::train
