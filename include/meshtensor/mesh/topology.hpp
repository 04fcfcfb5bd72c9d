#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace meshtensor {

/// How far apart two ranks sit: the outermost boundary between them.
enum class LinkLevel : std::uint8_t {
  domain = 0,   ///< the same domain (e.g. one NVLink island), or the same rank
  host = 1,     ///< the same host, different domains
  network = 2,  ///< different hosts
};

/// "domain", "host" or "network".
std::string_view link_level_name(LinkLevel level);

/// One level's link: what a collective over it pays per call and per byte.
struct LinkFigures {
  double latency_s = 0;             ///< per collective
  double bandwidth_bytes_s = 10e9;  ///< what one rank sends or receives per second
};

/// The three levels' links: inside a domain, between the domains of one host, between hosts.
using LinkLevels = std::array<LinkFigures, 3>;

/// Default links: `inside` within a domain; between domains `inside` plus 5 us and a quarter of
/// its bandwidth; between hosts `inside` plus 20 us and a twentieth of its bandwidth.
LinkLevels default_links(LinkFigures inside = {});

/// The largest link latency accepted, in seconds.
inline constexpr double kMaxLinkLatencySeconds = 10.0;
/// The largest link bandwidth accepted, in GB/s (far above any link: a value past it is a unit
/// mistake, e.g. bytes per second given as GB/s).
inline constexpr double kMaxLinkGigabytesPerSecond = 100000.0;

/// Parses "LATENCY,GBPS": a latency with its unit (ns, us, ms or s; a bare number is refused as
/// ambiguous) and a bandwidth in GB/s (1e9 bytes), e.g. "20us,10". ParseError naming `what`,
/// the text and the part at fault otherwise (a latency without a unit, negative, non-finite or
/// past kMaxLinkLatencySeconds; a bandwidth not above 0 or past kMaxLinkGigabytesPerSecond).
LinkFigures parse_link_figures(std::string_view text, std::string_view what = "link");

/// Where the ranks of a job sit: ranks grouped into hosts, and optionally the ranks of a host
/// into domains, with each level's link. Pure data, an input of the planner like the mesh.
/// Default-constructed: every rank on one host, in one domain.
class Topology {
 public:
  /// Every rank on one host.
  Topology() = default;
  /// `host_of[r]` and `domain_of[r]` (domain numbers unique across hosts; empty: one domain per
  /// host) per rank, hosts' names (empty: "host<i>"). InvalidArgument when the lists disagree in
  /// length, a number is negative, or a domain spans two hosts.
  Topology(std::vector<int> host_of, std::vector<int> domain_of = {},
           std::vector<std::string> host_names = {}, LinkLevels links = default_links());

  /// `ranks` ranks on hosts of `host_sizes` ranks each, in rank order, the last host taking what
  /// is left when the sizes run short of `ranks` (one size repeats: 8 -> 8,8,...; "jagged" when
  /// `ranks` is not a multiple). `ranks_per_domain` > 0 cuts each host into domains of that many
  /// ranks (the last one of a host may be smaller). InvalidArgument naming the value when a size
  /// is below 1 or the sizes hold more ranks than `ranks` in more hosts than needed.
  static Topology from_host_sizes(std::int64_t ranks, const std::vector<std::int64_t>& host_sizes,
                                  std::int64_t ranks_per_domain = 0,
                                  LinkLevels links = default_links());
  /// Ranks whose names are equal share a host (hosts numbered by first appearance).
  static Topology from_host_names(const std::vector<std::string>& names,
                                  LinkLevels links = default_links());

  /// True when every rank sits on one host in one domain: nothing is priced per level.
  bool single_level() const { return single_level_; }
  /// Number of ranks described (0 for the default single-host topology).
  std::int64_t ranks() const { return static_cast<std::int64_t>(host_of_.size()); }
  /// Number of hosts (1 for the default).
  int hosts() const;
  /// Host of `rank` (0 for the default).
  int host(std::int64_t rank) const;
  /// Domain of `rank` (its host's number when the topology has no domains).
  int domain(std::int64_t rank) const;
  /// Name of host `host`.
  std::string host_name(int host) const;
  /// The links per level.
  const LinkLevels& links() const { return links_; }
  /// The link of `level`.
  const LinkFigures& link(LinkLevel level) const { return links_[static_cast<std::size_t>(level)]; }
  /// The outermost level a group of these ranks crosses.
  LinkLevel level_of(std::span<const std::int64_t> ranks) const;
  /// Ranks per host, "4,4,3"; "all" for the default.
  std::string host_sizes_text() const;
  /// "3 hosts (4,4,3 ranks), 2 domains per host; links domain 0us 10GB/s, ...".
  std::string to_string() const;
  /// A key equal for equal topologies (placement and links), for caches.
  std::string key() const;

 private:
  std::vector<int> host_of_;
  std::vector<int> domain_of_;
  std::vector<std::string> host_names_;
  LinkLevels links_ = default_links();
  bool single_level_ = true;  // every rank on one host, in one domain
};

/// How a group's members sit on a topology, as the two-level algorithms need it.
struct GroupSpread {
  LinkLevel level = LinkLevel::domain;  ///< outermost level the group crosses
  std::int64_t members = 1;             ///< the group's size
  int units = 1;     ///< hosts (network level) or domains (host level) the members occupy
  int per_unit = 0;  ///< members on each of them when every one holds as many; 0 when jagged
  int fewest = 0;    ///< members on the unit that holds the fewest
  int most = 0;      ///< members on the unit that holds the most
  LinkLevel inner = LinkLevel::domain;  ///< outermost level crossed inside one unit
  /// True when the units hold different numbers of members.
  bool jagged() const { return per_unit == 0 && units > 1; }
};

/// The spread of `ranks` (a group's members) over `topology`.
GroupSpread spread_of(const Topology& topology, std::span<const std::int64_t> ranks);

/// The group positions of `ranks` (a group's members, in group order) on each unit they
/// occupy: hosts when they cross the network, else domains; units in topology order, positions
/// ascending. Two groups with equal lists sum in the same order in two levels.
std::vector<std::vector<int>> unit_positions(const Topology& topology,
                                             std::span<const std::int64_t> ranks);

/// The ring collectives the cost model prices per level.
enum class RingKind : std::uint8_t { all_reduce, reduce_scatter, all_gather };

/// What a collective costs on a rank besides its link.
struct LocalCosts {
  double per_collective_s = 50e-6;          ///< start-up and synchronisation of one call
  double memory_bandwidth_bytes_s = 100e9;  ///< one rank's copies and reductions
};

/// Seconds one ring collective of `kind` takes over `members` ranks on `link`: the call's fixed
/// cost and the link's latency, the bytes one member moves ((n-1)/n of `bytes`, twice for
/// all_reduce; `bytes` is the larger of a member's buffers) over the link's bandwidth, and the
/// bytes it reduces or writes locally (`bytes`, twice for all_reduce) over the memory's.
double ring_seconds(RingKind kind, std::int64_t members, double bytes, const LinkFigures& link,
                    const LocalCosts& local);

/// What a collective over one group costs flat and in two levels.
struct TwoLevelPrice {
  double flat_s = 0;       ///< one collective over the group, at its outermost level
  double two_level_s = 0;  ///< inside units, across them, inside again; +inf when impossible
  bool possible = false;   ///< the group spans several units, one of them holding 2 or more
  bool cheaper() const { return possible && two_level_s < flat_s; }
};

/// What the two-level form carries beyond the flat form's bytes. Exact sums in fixed point carry
/// each value as int64 limbs (`bytes_scale`: limb bytes per value byte; the flat exact
/// collectives reduce the values themselves) and first agree on a one-byte key per value
/// (`key_bytes`, an all_reduce of its own in two levels).
struct TwoLevelExtra {
  double bytes_scale = 1;
  double key_bytes = 0;
};

/// Prices a collective of `kind` over a group spread as `spread`, `bytes` per member (the whole
/// buffer a member reduces or ends with), each collective paying `local` too. Flat:
/// one ring at the group's outermost level, plus `flat_copy_s` (the packing it needs). Two
/// levels: all_reduce = reduce_scatter inside each unit, all_reduce of one k-th across units,
/// all_gather inside; reduce_scatter = inside, then across on one k-th, plus `reorder_copy_s`
/// (the buffer reordered so that both splits are contiguous); all_gather the reverse.
///
/// Jagged groups (units holding different numbers of members): reduce_scatter = the buffer
/// reordered into per-member blocks, reduce_scatter inside each unit (a member keeps its own
/// segment and a 1/k share of every other unit's member's segment), then one exchange across
/// units in which each member sends those shares home; priced at the unit with the fewest
/// members, whose members carry the largest shares. all_gather the reverse; all_reduce both.
TwoLevelPrice price_two_level(const Topology& topology, const GroupSpread& spread, RingKind kind,
                              double bytes, const LocalCosts& local, double flat_copy_s,
                              double reorder_copy_s, const TwoLevelExtra& extra = {});

}  // namespace meshtensor
