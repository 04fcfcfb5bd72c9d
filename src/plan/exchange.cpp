#include <map>

#include <meshtensor/plan/exchange.hpp>

namespace meshtensor::plan {

namespace {
// Members grouped by identical non-empty blocks before the step; -1 for an empty block.
std::vector<int> holder_classes(const std::vector<Layout>& before,
                                std::vector<std::vector<int>>& classes) {
  std::map<std::pair<std::vector<std::int64_t>, std::vector<std::int64_t>>, int> index;
  std::vector<int> class_of(before.size(), -1);
  for (std::size_t i = 0; i < before.size(); ++i) {
    if (before[i].numel() == 0) continue;
    auto [it, inserted] = index.try_emplace({before[i].local_shape.dims(), before[i].global_offset},
                                            static_cast<int>(classes.size()));
    if (inserted) classes.emplace_back();
    classes[static_cast<std::size_t>(it->second)].push_back(static_cast<int>(i));
    class_of[i] = it->second;
  }
  return class_of;
}

// The holder in `holders` that sends to `receiver`.
int sender_for(const std::vector<int>& holders, int receiver) {
  for (int holder : holders) {
    if (holder == receiver) return holder;
  }
  return holders[static_cast<std::size_t>(receiver) % holders.size()];
}
}  // namespace

GroupExchange group_exchange(const DeviceMesh& mesh, const Step& step, const Shape& shape,
                             std::int64_t rank) {
  GroupExchange exchange;
  exchange.members = mesh.group_ranks(rank, step.group);
  const std::size_t n = exchange.members.size();
  for (std::size_t i = 0; i < n; ++i) {
    if (exchange.members[i] == rank) exchange.position = static_cast<int>(i);
    exchange.before.push_back(local_layout(mesh, step.before, shape, exchange.members[i]));
    exchange.after.push_back(local_layout(mesh, step.after, shape, exchange.members[i]));
  }
  std::vector<std::vector<int>> classes;
  const std::vector<int> class_of = holder_classes(exchange.before, classes);
  const int me = exchange.position;
  const auto mine = static_cast<std::size_t>(me);
  const Layout nothing{Shape(std::vector<std::int64_t>(static_cast<std::size_t>(shape.rank()), 0)),
                       std::vector<std::int64_t>(static_cast<std::size_t>(shape.rank()), 0)};
  exchange.send.assign(n, nothing);
  exchange.recv.assign(n, nothing);
  for (std::size_t j = 0; j < n; ++j) {
    const int other = static_cast<int>(j);
    if (class_of[mine] >= 0 &&
        sender_for(classes[static_cast<std::size_t>(class_of[mine])], other) == me) {
      exchange.send[j] = intersect(exchange.before[mine], exchange.after[j]);
    }
    if (class_of[j] >= 0 &&
        sender_for(classes[static_cast<std::size_t>(class_of[j])], me) == other) {
      exchange.recv[j] = intersect(exchange.before[j], exchange.after[mine]);
    }
  }
  return exchange;
}

}  // namespace meshtensor::plan
