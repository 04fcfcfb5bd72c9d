// Topologies as pure data: hosts and domains, levels, spreads and the two-level price.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/mesh/topology.hpp>

#include "support/error_message.hpp"

namespace meshtensor {
namespace {

using testing::error_message;

TEST(Topology, RanksPerHostRepeatsAndTheLastHostIsJagged) {
  const Topology topology = Topology::from_host_sizes(11, {4});
  EXPECT_EQ(topology.hosts(), 3);
  EXPECT_EQ(topology.host_sizes_text(), "4,4,3");
  EXPECT_EQ(topology.host(3), 0);
  EXPECT_EQ(topology.host(4), 1);
  EXPECT_EQ(topology.host(10), 2);
  EXPECT_FALSE(topology.single_level());
  EXPECT_EQ(Topology::from_host_sizes(11, {3, 5, 3}).host_sizes_text(), "3,5,3");
  EXPECT_TRUE(Topology::from_host_sizes(8, {8}).single_level());
  EXPECT_TRUE(Topology().single_level());
}

TEST(Topology, LevelsOfGroups) {
  const Topology topology = Topology::from_host_sizes(16, {8}, 4);
  const std::vector<std::int64_t> same_domain = {0, 1, 3};
  const std::vector<std::int64_t> same_host = {0, 4};
  const std::vector<std::int64_t> across = {7, 8};
  EXPECT_EQ(topology.level_of(same_domain), LinkLevel::domain);
  EXPECT_EQ(topology.level_of(same_host), LinkLevel::host);
  EXPECT_EQ(topology.level_of(across), LinkLevel::network);
  EXPECT_EQ(topology.domain(5), 1);
  EXPECT_EQ(topology.domain(8), 2);
}

TEST(Topology, HostNamesGroupRanks) {
  const Topology topology = Topology::from_host_names({"b", "a", "b", "a"});
  EXPECT_EQ(topology.hosts(), 2);
  EXPECT_EQ(topology.host(2), 0);
  EXPECT_EQ(topology.host(3), 1);
  EXPECT_EQ(topology.host_name(1), "a");
}

TEST(Topology, SpreadSeesUniformAndJaggedGroups) {
  // Seed 000: (ddp=8, fsdp=5) on hosts of 8.
  const Topology topology = Topology::from_host_sizes(40, {8});
  std::vector<std::int64_t> all(40);
  for (std::int64_t r = 0; r < 40; ++r)
    all[static_cast<std::size_t>(r)] = r;
  const GroupSpread whole = spread_of(topology, all);
  EXPECT_EQ(whole.level, LinkLevel::network);
  EXPECT_EQ(whole.units, 5);
  EXPECT_EQ(whole.per_unit, 8);
  EXPECT_EQ(whole.members, 40);
  const std::vector<std::int64_t> fsdp = {5, 6, 7, 8, 9};  // 3 on host 0, 2 on host 1
  const GroupSpread jagged = spread_of(topology, fsdp);
  EXPECT_EQ(jagged.units, 2);
  EXPECT_EQ(jagged.per_unit, 0);
  EXPECT_EQ(jagged.fewest, 2);
  EXPECT_EQ(jagged.most, 3);
  EXPECT_TRUE(jagged.jagged());
  EXPECT_FALSE(whole.jagged());
}

TEST(Topology, JaggedGroupsPayOffInTwoLevelsOnSlowNetworks) {
  // Seed 000's fsdp group {5..9} (3 + 2) on the README's links: 1 GB/s inside, 0.05 across.
  const Topology topology = Topology::from_host_sizes(
      40, {8}, 0,
      {LinkFigures{10e-6, 1e9}, LinkFigures{15e-6, 0.25e9}, LinkFigures{50e-6, 0.05e9}});
  const std::vector<std::int64_t> fsdp = {5, 6, 7, 8, 9};
  const GroupSpread spread = spread_of(topology, fsdp);
  for (const RingKind kind :
       {RingKind::reduce_scatter, RingKind::all_gather, RingKind::all_reduce}) {
    const TwoLevelPrice large = price_two_level(topology, spread, kind, 4e6, LocalCosts{}, 0, 0);
    EXPECT_TRUE(large.possible);
    // Across: a member of the 2-member host sends 3/10 of the buffer, not 4/5 of it.
    EXPECT_GT(large.flat_s, 2 * large.two_level_s);
    EXPECT_FALSE(price_two_level(topology, spread, kind, 64, LocalCosts{}, 0, 0).cheaper());
  }
  // One member per host: nothing to do inside a host.
  const std::vector<std::int64_t> spread_out = {0, 8, 16};
  EXPECT_FALSE(price_two_level(topology, spread_of(topology, spread_out), RingKind::all_reduce, 4e6,
                               LocalCosts{}, 0, 0)
                   .possible);
  // Seed 000's ddp group {0,5,...,35} (2,2,1,2,1): the single-member hosts relay as much as a
  // flat ring sends, so the model keeps it flat.
  std::vector<std::int64_t> ddp;
  for (std::int64_t r = 0; r < 40; r += 5)
    ddp.push_back(r);
  EXPECT_FALSE(price_two_level(topology, spread_of(topology, ddp), RingKind::all_reduce, 4e6,
                               LocalCosts{}, 0, 0)
                   .cheaper());
}

TEST(Topology, TwoLevelsPayOffForLargeBuffersOnly) {
  const Topology topology =
      Topology::from_host_sizes(40, {8}, 0, default_links(LinkFigures{5e-6, 100e9}));
  std::vector<std::int64_t> all(40);
  for (std::int64_t r = 0; r < 40; ++r)
    all[static_cast<std::size_t>(r)] = r;
  const GroupSpread spread = spread_of(topology, all);
  const TwoLevelPrice large =
      price_two_level(topology, spread, RingKind::all_reduce, 64e6, LocalCosts{}, 0, 0);
  EXPECT_TRUE(large.cheaper());
  EXPECT_GT(large.flat_s, 4 * large.two_level_s);
  const TwoLevelPrice small =
      price_two_level(topology, spread, RingKind::all_reduce, 64, LocalCosts{}, 0, 0);
  EXPECT_TRUE(small.possible);
  EXPECT_FALSE(small.cheaper());
}

TEST(Topology, BadValuesAreNamed) {
  EXPECT_NE(error_message([] { Topology::from_host_sizes(8, {0}); }).find("ranks per host 0"),
            std::string::npos);
  EXPECT_NE(error_message([] {
              Topology::from_host_sizes(11, {4, 4});
            }).find("ranks per host 4,4 hold 8 ranks, fewer than the 11"),
            std::string::npos);
  EXPECT_NE(error_message([] {
              Topology::from_host_sizes(6, {4, 4, 4});
            }).find("ranks per host 4,4,4 hold 12 ranks, more than the 6"),
            std::string::npos);
  // A list longer than needed is refused too, never cut to fit.
  EXPECT_NE(error_message([] {
              Topology::from_host_sizes(4, {2, 3});
            }).find("ranks per host 2,3 hold 5 ranks, more than the 4"),
            std::string::npos);
  EXPECT_EQ(Topology::from_host_sizes(5, {2, 3}).host_sizes_text(), "2,3");
  EXPECT_NE(error_message([] {
              parse_link_figures("fast", "--link-inter");
            }).find("--link-inter 'fast': no comma"),
            std::string::npos);
  // Units must be said, and values in range.
  for (const char* bad : {"1e-6,200", "1us,200e9", "20us,0", "11s,1", "-1us,1", "1us,nan"})
    EXPECT_NE(error_message([&] {
                parse_link_figures(bad, "--link-host");
              }).find(fmt::format("--link-host '{}'", bad)),
              std::string::npos)
        << bad;
  const LinkFigures link = parse_link_figures("2ms,0.5");
  EXPECT_DOUBLE_EQ(link.latency_s, 2e-3);
  EXPECT_DOUBLE_EQ(link.bandwidth_bytes_s, 0.5e9);
}

}  // namespace
}  // namespace meshtensor
