// Shards a tensor over a 2x2 mesh of thread ranks, redistributes it, and checks that every rank
// ends with the whole tensor.
#include <cstdio>
#include <memory>

#include <meshtensor/comm/mesh_groups.hpp>
#include <meshtensor/comm/threads_backend.hpp>
#include <meshtensor/dtensor/dtensor.hpp>
#include <meshtensor/mesh/parse.hpp>

int main() {
  using namespace meshtensor;
  const Tensor global = Tensor::arange(Shape{5, 3}, DType::f32);
  int matches = 0;
  comm::run_threads(4, [&](comm::Communicator& world) {
    auto groups = std::make_shared<comm::MeshGroups>(
        DeviceMesh({2, 2}),
        std::shared_ptr<comm::Communicator>(&world, [](comm::Communicator*) {}));
    const dtensor::DTensor sharded = dtensor::distribute(global, groups, parse_spec("S0,S1"));
    const Tensor whole = sharded.redistribute(parse_spec("R,R")).full_tensor();
    if (whole.bitwise_equal(global) && world.rank() == 0) matches = 1;
  });
  std::printf("consumer %s\n", matches == 1 ? "OK" : "FAILED");
  return matches == 1 ? 0 : 1;
}
