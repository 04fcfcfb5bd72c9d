#include <algorithm>
#include <map>
#include <numeric>
#include <vector>

#include <gtest/gtest.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/core/random.hpp>
#include <meshtensor/mesh/layout.hpp>

namespace meshtensor {

void PrintTo(const Layout& layout, std::ostream* out) {
  *out << layout.to_string();
}

namespace {

// torch.chunk on an explicit list: pieces of ceil(n/k) items, as many as the list fills (an
// empty list gives one empty piece). DTensor pads the missing pieces with empty ones.
std::vector<std::int64_t> torch_chunk_piece(const std::vector<std::int64_t>& items,
                                            std::int64_t parts, std::int64_t index) {
  const auto n = static_cast<std::int64_t>(items.size());
  const std::int64_t chunk = (n + parts - 1) / parts;
  std::vector<std::vector<std::int64_t>> pieces;
  for (std::int64_t start = 0; start < n; start += chunk) {
    pieces.emplace_back(items.begin() + start, items.begin() + std::min(n, start + chunk));
  }
  if (index < static_cast<std::int64_t>(pieces.size()))
    return pieces[static_cast<std::size_t>(index)];
  return {};
}

TEST(ChunkExtent, MatchesTorchChunkForAllSmallCases) {
  for (std::int64_t n = 0; n <= 40; ++n) {
    std::vector<std::int64_t> items(static_cast<std::size_t>(n));
    std::iota(items.begin(), items.end(), 0);
    for (std::int64_t parts = 1; parts <= 12; ++parts) {
      std::int64_t total = 0;
      for (std::int64_t i = 0; i < parts; ++i) {
        const Chunk chunk = chunk_extent(n, parts, i);
        const auto expected = torch_chunk_piece(items, parts, i);
        ASSERT_EQ(chunk.size, static_cast<std::int64_t>(expected.size()))
            << n << "/" << parts << "#" << i;
        if (!expected.empty()) {
          ASSERT_EQ(chunk.offset, expected.front());
        }
        total += chunk.size;
      }
      EXPECT_EQ(total, n);
    }
  }
  // 5 rows over 4 parts: torch.chunk gives 2, 2, 1 and DTensor an empty fourth piece.
  EXPECT_EQ(chunk_extent(5, 4, 3), (Chunk{5, 0}));
  EXPECT_THROW(chunk_extent(5, 0, 0), InvalidArgument);
  EXPECT_THROW(chunk_extent(5, 2, 2), InvalidArgument);
}

TEST(ContextChunks, HeadTailGivesRankRChunksRAndTwoCpMinusOneMinusR) {
  // 16 positions over cp 4: 8 chunks of 2; rank 1 holds chunks 1 and 6.
  EXPECT_EQ(context_chunks(16, 4, 1), (std::vector<Chunk>{{2, 2}, {12, 2}}));
  EXPECT_EQ(context_chunks(16, 4, 3), (std::vector<Chunk>{{6, 2}, {8, 2}}));
  // Uneven by torch.chunk rules: 32 over cp 3 is 6 chunks of 6 and a last of 2.
  EXPECT_EQ(context_chunks(32, 3, 0), (std::vector<Chunk>{{0, 6}, {30, 2}}));
  EXPECT_EQ(context_chunks(32, 3, 2), (std::vector<Chunk>{{12, 6}, {18, 6}}));
  EXPECT_EQ(context_chunks(32, 3, 1, ContextSplit::contiguous), (std::vector<Chunk>{{11, 11}}));
  // Every position exactly once, for many lengths and degrees.
  for (std::int64_t length = 1; length <= 40; ++length) {
    for (std::int64_t cp = 1; cp <= 6; ++cp) {
      if (!context_splits(length, cp)) {
        EXPECT_THROW(context_chunks(length, cp, 0), InvalidArgument) << length << " " << cp;
        continue;
      }
      std::vector<int> seen(static_cast<std::size_t>(length), 0);
      for (std::int64_t r = 0; r < cp; ++r)
        for (const Chunk& c : context_chunks(length, cp, r))
          for (std::int64_t t = c.offset; t < c.offset + c.size; ++t)
            ++seen[static_cast<std::size_t>(t)];
      EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), length) << length << " " << cp;
    }
  }
  EXPECT_FALSE(context_splits(30, 8));  // chunks of 2: the 16th is empty
  EXPECT_TRUE(context_splits(30, 15));
  EXPECT_THROW(context_chunks(16, 4, 4), InvalidArgument);
}

struct RandomCase {
  DeviceMesh mesh;
  PlacementSpec spec;
  Shape shape;
  std::vector<std::vector<int>> split_order;  // per tensor dim: mesh dims, outermost first
};

RandomCase make_case(std::uint64_t seed) {
  std::uint64_t state = seed;
  auto next = [&](std::uint64_t bound) { return (state = mix64(state)) % bound; };
  const int mesh_dims = 1 + static_cast<int>(next(4));
  std::vector<std::int64_t> sizes;
  for (int m = 0; m < mesh_dims; ++m)
    sizes.push_back(1 + static_cast<std::int64_t>(next(5)));
  const int tensor_rank = 1 + static_cast<int>(next(3));
  std::vector<std::int64_t> dims;
  for (int t = 0; t < tensor_rank; ++t)
    dims.push_back(static_cast<std::int64_t>(next(10)));
  std::vector<Placement> placements;
  for (int m = 0; m < mesh_dims; ++m) {
    const auto kind = next(10);
    if (kind < 6) {
      placements.push_back(
          Placement::shard(static_cast<int>(next(static_cast<std::uint64_t>(tensor_rank)))));
    } else if (kind < 8) {
      placements.push_back(Placement::replicate());
    } else {
      placements.push_back(Placement::partial(next(2) == 0 ? ReduceOp::sum : ReduceOp::avg));
    }
  }
  // A random split order per tensor dim, given as levels.
  std::vector<std::vector<int>> split_order(static_cast<std::size_t>(tensor_rank));
  for (int m = 0; m < mesh_dims; ++m) {
    if (placements[static_cast<std::size_t>(m)].is_shard()) {
      split_order[static_cast<std::size_t>(placements[static_cast<std::size_t>(m)].shard_dim())]
          .push_back(m);
    }
  }
  std::vector<int> levels(static_cast<std::size_t>(mesh_dims), 0);
  for (auto& order : split_order) {
    for (std::size_t i = order.size(); i > 1; --i)
      std::swap(order[i - 1], order[next(i)]);
    for (std::size_t level = 0; level < order.size(); ++level)
      levels[static_cast<std::size_t>(order[level])] = static_cast<int>(level);
  }
  return {DeviceMesh(sizes), PlacementSpec(placements, levels), Shape(dims), split_order};
}

TEST(Layout, LocalBlocksEqualNestedTorchChunk) {
  for (std::uint64_t seed = 0; seed < 3000; ++seed) {
    const RandomCase c = make_case(seed);
    for (std::int64_t rank = 0; rank < c.mesh.size(); ++rank) {
      const Layout layout = local_layout(c.mesh, c.spec, c.shape, rank);
      const auto coordinates = c.mesh.coordinates(rank);
      for (int t = 0; t < c.shape.rank(); ++t) {
        std::vector<std::int64_t> items(static_cast<std::size_t>(c.shape[t]));
        std::iota(items.begin(), items.end(), 0);
        for (int m : c.split_order[static_cast<std::size_t>(t)]) {
          items = torch_chunk_piece(items, c.mesh.sizes()[static_cast<std::size_t>(m)],
                                    coordinates[static_cast<std::size_t>(m)]);
        }
        ASSERT_EQ(layout.local_shape[t], static_cast<std::int64_t>(items.size()))
            << "seed " << seed << " mesh " << c.mesh.to_string() << " spec " << c.spec.to_string()
            << " shape " << c.shape.to_string() << " rank " << rank << " dim " << t;
        if (!items.empty()) {
          ASSERT_EQ(layout.global_offset[static_cast<std::size_t>(t)], items.front());
        }
        ASSERT_GE(layout.global_offset[static_cast<std::size_t>(t)], 0);
        ASSERT_LE(layout.global_offset[static_cast<std::size_t>(t)] + layout.local_shape[t],
                  c.shape[t]);
      }
    }
  }
}

TEST(Layout, EachReplicaSetTilesTheTensorExactlyOnce) {
  for (std::uint64_t seed = 0; seed < 3000; ++seed) {
    const RandomCase c = make_case(seed);
    const Tensor global = Tensor::arange(c.shape, DType::i64);
    // Ranks agreeing on every non-Shard mesh dim form one replica set.
    std::map<std::vector<std::int64_t>, std::vector<std::int64_t>> coverage;
    const std::vector<int> fixed_dims = non_shard_mesh_dims(c.spec);
    for (std::int64_t rank = 0; rank < c.mesh.size(); ++rank) {
      std::vector<std::int64_t> key;
      const auto coordinates = c.mesh.coordinates(rank);
      for (int m : fixed_dims)
        key.push_back(coordinates[static_cast<std::size_t>(m)]);
      auto& counts = coverage[key];
      counts.resize(static_cast<std::size_t>(c.shape.numel()), 0);
      const Tensor block =
          local_view(global, local_layout(c.mesh, c.spec, c.shape, rank)).contiguous();
      for (std::int64_t index : block.values<std::int64_t>())
        ++counts[static_cast<std::size_t>(index)];
    }
    for (const auto& [key, counts] : coverage) {
      for (std::int64_t count : counts)
        ASSERT_EQ(count, 1) << "seed " << seed << " spec " << c.spec.to_string();
    }
  }
}

TEST(Layout, UnevenNestedShardsOnTwoByTwo) {
  // The case PyTorch's merged all_gather gets wrong: 5x3 on a 2x2 mesh with S0,S0.
  const DeviceMesh mesh({2, 2});
  const PlacementSpec spec({Placement::shard(0), Placement::shard(0)});
  const Shape shape{5, 3};
  EXPECT_EQ(local_layout(mesh, spec, shape, 0), (Layout{Shape{2, 3}, {0, 0}}));
  EXPECT_EQ(local_layout(mesh, spec, shape, 1), (Layout{Shape{1, 3}, {2, 0}}));
  EXPECT_EQ(local_layout(mesh, spec, shape, 2), (Layout{Shape{1, 3}, {3, 0}}));
  EXPECT_EQ(local_layout(mesh, spec, shape, 3), (Layout{Shape{1, 3}, {4, 0}}));
  // The other split order: mesh dim 1 splits first.
  const PlacementSpec reversed({Placement::shard(0), Placement::shard(0)}, {1, 0});
  EXPECT_EQ(local_layout(mesh, reversed, shape, 1), (Layout{Shape{1, 3}, {3, 0}}));
  EXPECT_EQ(local_layout(mesh, reversed, shape, 3), (Layout{Shape{1, 3}, {4, 0}}));
  EXPECT_EQ(local_layout(mesh, reversed, shape, 2), (Layout{Shape{1, 3}, {2, 0}}));
}

TEST(Layout, RejectsSpecsThatDoNotFit) {
  const DeviceMesh mesh({2, 2});
  EXPECT_THROW(
      local_layout(mesh, PlacementSpec({Placement::shard(1), Placement::replicate()}), Shape{4}, 0),
      InvalidArgument);
  EXPECT_THROW(local_layout(mesh, PlacementSpec({Placement::replicate()}), Shape{4}, 0),
               InvalidArgument);
  EXPECT_THROW(local_layout(mesh, PlacementSpec({Placement::replicate(), Placement::replicate()}),
                            Shape{4}, 4),
               InvalidArgument);
}

}  // namespace
}  // namespace meshtensor
