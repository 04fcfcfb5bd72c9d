#include <algorithm>

#include <gtest/gtest.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/mesh/device_mesh.hpp>

namespace meshtensor {
namespace {

TEST(DeviceMesh, RanksAndCoordinatesAreRowMajor) {
  const DeviceMesh mesh({2, 3, 4});
  EXPECT_EQ(mesh.size(), 24);
  EXPECT_EQ(mesh.coordinates(0), (std::vector<std::int64_t>{0, 0, 0}));
  EXPECT_EQ(mesh.coordinates(23), (std::vector<std::int64_t>{1, 2, 3}));
  EXPECT_EQ(mesh.coordinates(13), (std::vector<std::int64_t>{1, 0, 1}));
  for (std::int64_t rank = 0; rank < mesh.size(); ++rank) {
    EXPECT_EQ(mesh.rank_at(mesh.coordinates(rank)), rank);
  }
}

TEST(DeviceMesh, GroupRanksFollowTheGivenMajorToMinorOrder) {
  const DeviceMesh mesh({2, 3, 4});
  const std::vector<std::vector<int>> orders = {{},     {0},       {2},       {0, 2},
                                                {2, 0}, {1, 2, 0}, {2, 1, 0}, {0, 1, 2}};
  for (std::int64_t rank = 0; rank < mesh.size(); ++rank) {
    const auto mine = mesh.coordinates(rank);
    for (const auto& dims : orders) {
      // Brute force: every rank equal to `rank` outside `dims`, sorted by coordinates along dims.
      std::vector<std::int64_t> expected;
      for (std::int64_t other = 0; other < mesh.size(); ++other) {
        const auto theirs = mesh.coordinates(other);
        bool same_outside = true;
        for (int d = 0; d < mesh.ndim(); ++d) {
          if (std::find(dims.begin(), dims.end(), d) == dims.end() && theirs[d] != mine[d])
            same_outside = false;
        }
        if (same_outside) expected.push_back(other);
      }
      std::sort(expected.begin(), expected.end(), [&](std::int64_t a, std::int64_t b) {
        const auto ca = mesh.coordinates(a);
        const auto cb = mesh.coordinates(b);
        for (int d : dims) {
          if (ca[d] != cb[d]) return ca[d] < cb[d];
        }
        return false;
      });
      const auto group = mesh.group_ranks(rank, dims);
      ASSERT_EQ(group, expected) << "rank " << rank;
      const auto position = mesh.group_position(rank, dims);
      ASSERT_EQ(group[static_cast<std::size_t>(position)], rank);
      EXPECT_EQ(mesh.group_size(dims), static_cast<std::int64_t>(group.size()));
    }
  }
}

TEST(DeviceMesh, NamesAreLookedUpAndValidated) {
  const DeviceMesh mesh({2, 4}, {"dp", "tp"});
  EXPECT_EQ(mesh.dim_index("tp"), 1);
  EXPECT_EQ(mesh.dim_name(0), "dp");
  EXPECT_EQ(mesh.to_string(), "dp=2,tp=4");
  EXPECT_EQ(DeviceMesh({2, 4}).dim_name(1), "dim1");
  EXPECT_THROW(mesh.dim_index("pp"), InvalidArgument);
  EXPECT_THROW(DeviceMesh({2, 4}, {"dp"}), InvalidArgument);
  EXPECT_THROW(DeviceMesh({2, 4}, {"dp", "dp"}), InvalidArgument);
  EXPECT_THROW(DeviceMesh({2, 4}, {"dp", "1x"}), InvalidArgument);
}

TEST(DeviceMesh, BadSizesRanksAndDimsAreRejected) {
  EXPECT_THROW(DeviceMesh(std::vector<std::int64_t>{}), InvalidArgument);
  EXPECT_THROW(DeviceMesh({2, 0}), InvalidArgument);
  EXPECT_THROW(DeviceMesh({1 << 11, 1 << 11}), InvalidArgument);
  const DeviceMesh mesh({2, 2});
  EXPECT_THROW(mesh.coordinates(4), InvalidArgument);
  EXPECT_THROW(mesh.coordinates(-1), InvalidArgument);
  const int repeated[] = {0, 0};
  EXPECT_THROW(mesh.group_ranks(0, repeated), InvalidArgument);
  const int outside[] = {2};
  EXPECT_THROW(mesh.group_ranks(0, outside), InvalidArgument);
  const std::int64_t bad_coordinates[] = {0, 2};
  EXPECT_THROW(mesh.rank_at(bad_coordinates), InvalidArgument);
}

TEST(DeviceMesh, SizeOneDimsAreLegal) {
  const DeviceMesh mesh({1, 3, 1});
  EXPECT_EQ(mesh.size(), 3);
  const int dims[] = {0, 2};
  EXPECT_EQ(mesh.group_ranks(1, dims), (std::vector<std::int64_t>{1}));
}

}  // namespace
}  // namespace meshtensor
