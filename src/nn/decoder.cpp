#include <fmt/format.h>

#include <meshtensor/nn/decoder.hpp>

namespace meshtensor::nn {

std::vector<std::vector<Module*>> Decoder::parameter_groups() {
  std::vector<std::vector<Module*>> groups;
  for (Module* unit : units())
    groups.push_back({unit});
  return groups;
}

std::vector<Parameter*> Decoder::parameters() {
  std::vector<Parameter*> all;
  for (Module* unit : units())
    for (Parameter* p : unit->parameters())
      all.push_back(p);
  return all;
}

std::vector<KeyValueCache> make_layer_caches(std::int64_t slots,
                                             const std::vector<std::int64_t>& heads,
                                             std::int64_t head_dim, std::int64_t context) {
  std::vector<KeyValueCache> caches;
  for (const std::int64_t layer_heads : heads)
    caches.emplace_back(slots, layer_heads, head_dim, context);
  return caches;
}

}  // namespace meshtensor::nn
