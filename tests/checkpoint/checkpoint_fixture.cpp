// Writes a checkpoint of known tensors for the independent reader (read_checkpoint.py): every
// dtype, uneven blocks over a 2x2 mesh of thread ranks, a replicated tensor and a scalar; each
// global tensor also goes to DIR/expected/<name>.raw (row-major, little-endian) for comparison.
// Usage: checkpoint_fixture DIR
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <meshtensor/checkpoint/checkpoint.hpp>
#include <meshtensor/comm/mesh_groups.hpp>
#include <meshtensor/comm/threads_backend.hpp>
#include <meshtensor/dtensor/dtensor.hpp>
#include <meshtensor/mesh/parse.hpp>

namespace {

struct Case {
  std::string name;
  meshtensor::Tensor global;
  std::string spec;
};

}  // namespace

int main(int argc, char** argv) {
  using namespace meshtensor;
  if (argc != 2) {
    std::fprintf(stderr, "usage: checkpoint_fixture DIR\n");
    return 2;
  }
  const std::string root = argv[1];
  const std::vector<Case> cases = {
      {"weight", Tensor::random_normal(Shape{13, 7}, DType::f32, 1), "S0,S1"},
      {"bf16.values", Tensor::random_normal(Shape{5, 3}, DType::bf16, 2), "R,S0"},
      {"half", Tensor::random_normal(Shape{7}, DType::f16, 3), "S0,S0"},
      {"doubles", Tensor::random_normal(Shape{3, 5, 2}, DType::f64, 4), "S2,S0"},
      {"counts", Tensor::random_int(Shape{9, 2}, DType::i64, 5, -1000000, 1000000), "S0,R"},
      {"ints", Tensor::random_int(Shape{4}, DType::i32, 6, -70000, 70000), "R,R"},
      {"bytes", Tensor::random_int(Shape{10}, DType::u8, 7, 0, 256), "S0,S0"},
      {"step", Tensor::full(Shape{}, DType::i64, 1234), "R,R"},
  };
  const DeviceMesh mesh({2, 2});
  comm::run_threads(4, [&](comm::Communicator& world) {
    auto groups = std::make_shared<comm::MeshGroups>(
        mesh, std::shared_ptr<comm::Communicator>(&world, [](comm::Communicator*) {}));
    std::vector<checkpoint::SaveItem> items;
    for (const Case& c : cases)
      items.push_back(
          checkpoint::save_item(dtensor::distribute(c.global, groups, parse_spec(c.spec)), c.name));
    checkpoint::save(world, root, 42, items);
  });
  std::filesystem::create_directories(root + "/expected");
  for (const Case& c : cases) {
    std::ofstream out(root + "/expected/" + c.name + ".raw", std::ios::binary);
    const auto bytes = c.global.bytes();
    out.write(reinterpret_cast<const char*>(bytes.data()),
              static_cast<std::streamsize>(bytes.size()));
  }
  std::printf("wrote %zu tensors under %s\n", cases.size(), root.c_str());
  return 0;
}
