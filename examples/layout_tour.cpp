// A tour of what a sharded tensor is, on one machine and without communication: cut a global
// tensor into the blocks every rank of a 2x2 mesh holds under a placement spec, then rebuild the
// global tensor from those blocks (what an all-gather does) and from Partial contributions (what
// an all-reduce does), and check the bits.
#include <iostream>
#include <vector>

#include <fmt/format.h>

#include <meshtensor/core/digest.hpp>
#include <meshtensor/kernels/elementwise.hpp>
#include <meshtensor/mesh/layout.hpp>
#include <meshtensor/mesh/parse.hpp>

using namespace meshtensor;

namespace {
// Rebuilds a global tensor from each rank's block (any spec without Partial).
Tensor assemble(const DeviceMesh& mesh, const PlacementSpec& spec, const Shape& shape,
                const std::vector<Tensor>& blocks, DType dtype) {
  Tensor global(shape, dtype);
  for (std::int64_t rank = 0; rank < mesh.size(); ++rank) {
    Tensor target = local_view(global, local_layout(mesh, spec, shape, rank));
    target.copy_from(blocks[static_cast<std::size_t>(rank)]);
  }
  return global;
}
}  // namespace

int main() {
  const DeviceMesh mesh = parse_mesh("2x2", "dp,tp");
  const Shape shape = parse_shape("5x3");
  const Tensor global = Tensor::random_normal(shape, DType::f32, 7);
  std::cout << fmt::format("global tensor {} f32, digest {}\n", shape.to_string(),
                           digest_hex(global.digest()));

  for (const char* text : {"S0,S1", "S0,S0", "S0@1,S0@0", "R,S1"}) {
    const PlacementSpec spec = parse_spec(text);
    std::vector<Tensor> blocks;
    std::cout << fmt::format("\nspec {} on mesh {}:\n", spec.to_string(), mesh.to_string());
    for (std::int64_t rank = 0; rank < mesh.size(); ++rank) {
      const Layout layout = local_layout(mesh, spec, shape, rank);
      blocks.push_back(local_view(global, layout).clone());
      std::cout << fmt::format("  rank {} holds {}\n", rank, layout.to_string());
    }
    const Tensor rebuilt = assemble(mesh, spec, shape, blocks, DType::f32);
    std::cout << fmt::format("  reassembled digest {} ({})\n", digest_hex(rebuilt.digest()),
                             rebuilt.bitwise_equal(global) ? "identical" : "DIFFERENT");
    if (!rebuilt.bitwise_equal(global)) return 1;
  }

  // Partial(sum) over the dp dim: each dp rank holds a contribution; the value is their sum,
  // combined in ascending rank order so every reader gets the same bits.
  std::cout << "\nP(sum) over dp: contributions summed in rank order\n";
  Tensor total(shape, DType::f32);
  for (std::int64_t dp = 0; dp < mesh.size(0); ++dp) {
    const Tensor contribution =
        Tensor::random_normal(shape, DType::f32, 100 + static_cast<std::uint64_t>(dp));
    kernels::accumulate(total, contribution, ReduceOp::sum);
    std::cout << fmt::format("  contribution {} digest {}\n", dp,
                             digest_hex(contribution.digest()));
  }
  std::cout << fmt::format("  replicated result digest {}\n", digest_hex(total.digest()));
  return 0;
}
