#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <map>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/mesh/topology.hpp>

namespace meshtensor {

std::string_view link_level_name(LinkLevel level) {
  switch (level) {
    case LinkLevel::domain:
      return "domain";
    case LinkLevel::host:
      return "host";
    case LinkLevel::network:
      return "network";
  }
  return "?";
}

LinkLevels default_links(LinkFigures inside) {
  return {inside, LinkFigures{inside.latency_s + 5e-6, inside.bandwidth_bytes_s / 4},
          LinkFigures{inside.latency_s + 20e-6, inside.bandwidth_bytes_s / 20}};
}

LinkFigures parse_link_figures(std::string_view text, std::string_view what) {
  const auto fail = [&](std::string_view why) {
    return ParseError(fmt::format(
        "{} '{}': {} (LATENCY,GBPS, e.g. 20us,10: a latency with its unit ns, us, ms or s, up "
        "to {} s, and a bandwidth in GB/s above 0 and up to {})",
        what, text, why, kMaxLinkLatencySeconds, kMaxLinkGigabytesPerSecond));
  };
  const std::size_t comma = text.find(',');
  if (comma == std::string_view::npos) throw fail("no comma between latency and bandwidth");
  std::string latency_text(text.substr(0, comma));
  const std::string bandwidth_text(text.substr(comma + 1));
  double unit = 0;
  for (const auto& [suffix, scale] :
       {std::pair{"ns", 1e-9}, std::pair{"us", 1e-6}, std::pair{"ms", 1e-3}, std::pair{"s", 1.0}}) {
    const std::string_view s(suffix);
    if (latency_text.size() > s.size() && latency_text.ends_with(s)) {
      latency_text.resize(latency_text.size() - s.size());
      unit = scale;
      break;
    }
  }
  // A bare number would leave its scale to a guess (1e-6 could be seconds or microseconds).
  if (unit == 0) throw fail("the latency has no unit");
  const auto number = [&](const std::string& part, std::string_view name) {
    char* end = nullptr;
    errno = 0;
    const double value = part.empty() ? -1 : std::strtod(part.c_str(), &end);
    if (part.empty() || end != part.c_str() + part.size() || errno != 0 || !std::isfinite(value) ||
        value < 0) {
      throw fail(fmt::format("the {} '{}' is not a number of at least 0", name, part));
    }
    return value;
  };
  const double latency_s = number(latency_text, "latency") * unit;
  const double gbps = number(bandwidth_text, "bandwidth");
  if (latency_s > kMaxLinkLatencySeconds) throw fail("the latency is out of range");
  if (!(gbps > 0) || gbps > kMaxLinkGigabytesPerSecond) throw fail("the bandwidth is out of range");
  return LinkFigures{latency_s, gbps * 1e9};
}

Topology::Topology(std::vector<int> host_of, std::vector<int> domain_of,
                   std::vector<std::string> host_names, LinkLevels links)
    : host_of_(std::move(host_of)),
      domain_of_(std::move(domain_of)),
      host_names_(std::move(host_names)),
      links_(links) {
  if (!domain_of_.empty() && domain_of_.size() != host_of_.size()) {
    throw InvalidArgument(fmt::format("topology: {} ranks have a host but {} a domain",
                                      host_of_.size(), domain_of_.size()));
  }
  std::map<int, int> host_of_domain;
  for (std::size_t r = 0; r < host_of_.size(); ++r) {
    if (host_of_[r] < 0 || (!domain_of_.empty() && domain_of_[r] < 0)) {
      throw InvalidArgument(fmt::format("topology: rank {} has a negative host or domain", r));
    }
    if (domain_of_.empty()) continue;
    const auto [it, added] = host_of_domain.emplace(domain_of_[r], host_of_[r]);
    if (!added && it->second != host_of_[r]) {
      throw InvalidArgument(fmt::format("topology: domain {} spans hosts {} and {}", domain_of_[r],
                                        it->second, host_of_[r]));
    }
  }
  if (!host_names_.empty() && static_cast<int>(host_names_.size()) < hosts()) {
    throw InvalidArgument(
        fmt::format("topology: {} host names for {} hosts", host_names_.size(), hosts()));
  }
  for (std::size_t r = 0; r < host_of_.size(); ++r) {
    if (host_of_[r] != host_of_[0] || (!domain_of_.empty() && domain_of_[r] != domain_of_[0]))
      single_level_ = false;
  }
  for (const LinkFigures& link : links_) {
    if (!(link.latency_s >= 0) || !(link.bandwidth_bytes_s > 0)) {
      throw InvalidArgument(
          fmt::format("topology: a link needs a latency >= 0 and a bandwidth > "
                      "0, got {} s and {} bytes/s",
                      link.latency_s, link.bandwidth_bytes_s));
    }
  }
}

Topology Topology::from_host_sizes(std::int64_t ranks, const std::vector<std::int64_t>& host_sizes,
                                   std::int64_t ranks_per_domain, LinkLevels links) {
  if (ranks < 1) throw InvalidArgument(fmt::format("topology of {} ranks", ranks));
  if (host_sizes.empty()) throw InvalidArgument("topology: no host sizes");
  if (ranks_per_domain < 0) {
    throw InvalidArgument(fmt::format("ranks per domain {} is negative", ranks_per_domain));
  }
  std::int64_t listed = 0;
  for (const std::int64_t size : host_sizes) {
    if (size < 1) throw InvalidArgument(fmt::format("ranks per host {} is below 1", size));
    listed += size;
  }
  // A list names every host: its sum must be the mesh (one size repeats, the last host jagged).
  if (host_sizes.size() > 1 && listed != ranks) {
    throw InvalidArgument(fmt::format("ranks per host {} hold {} ranks, {} than the {} of the mesh",
                                      fmt::join(host_sizes, ","), listed,
                                      listed < ranks ? "fewer" : "more", ranks));
  }
  std::vector<int> host_of;
  std::vector<int> domain_of;
  int domains = 0;
  for (std::int64_t at = 0, host = 0; at < ranks; ++host) {
    if (host_sizes.size() > 1 && static_cast<std::size_t>(host) >= host_sizes.size()) {
      throw InvalidArgument(
          fmt::format("ranks per host {} hold {} ranks, fewer than the {} of "
                      "the mesh",
                      fmt::join(host_sizes, ","), at, ranks));
    }
    const std::int64_t size =
        host_sizes.size() == 1 ? host_sizes[0] : host_sizes[static_cast<std::size_t>(host)];
    const std::int64_t here = std::min(size, ranks - at);
    for (std::int64_t local = 0; local < here; ++local) {
      host_of.push_back(static_cast<int>(host));
      domain_of.push_back(domains +
                          static_cast<int>(ranks_per_domain > 0 ? local / ranks_per_domain : 0));
    }
    domains += static_cast<int>(
        ranks_per_domain > 0 ? (here + ranks_per_domain - 1) / ranks_per_domain : 1);
    at += here;
    if (at == ranks && host_sizes.size() > 1 &&
        static_cast<std::size_t>(host) + 1 < host_sizes.size()) {
      throw InvalidArgument(fmt::format("ranks per host {} hold more ranks than the {} of the mesh",
                                        fmt::join(host_sizes, ","), ranks));
    }
  }
  return Topology(std::move(host_of),
                  ranks_per_domain > 0 ? std::move(domain_of) : std::vector<int>{}, {}, links);
}

Topology Topology::from_host_names(const std::vector<std::string>& names, LinkLevels links) {
  std::map<std::string, int> number;
  std::vector<std::string> hosts;
  std::vector<int> host_of;
  for (const std::string& name : names) {
    const auto [it, added] = number.emplace(name, static_cast<int>(hosts.size()));
    if (added) hosts.push_back(name);
    host_of.push_back(it->second);
  }
  return Topology(std::move(host_of), {}, std::move(hosts), links);
}

int Topology::hosts() const {
  if (host_of_.empty()) return 1;
  return *std::max_element(host_of_.begin(), host_of_.end()) + 1;
}

int Topology::host(std::int64_t rank) const {
  if (host_of_.empty()) return 0;
  if (rank < 0 || rank >= ranks()) {
    throw InvalidArgument(fmt::format("rank {} is outside a topology of {} ranks", rank, ranks()));
  }
  return host_of_[static_cast<std::size_t>(rank)];
}

int Topology::domain(std::int64_t rank) const {
  if (domain_of_.empty()) return host(rank);
  return domain_of_.at(static_cast<std::size_t>(rank));
}

std::string Topology::host_name(int host) const {
  if (host >= 0 && static_cast<std::size_t>(host) < host_names_.size())
    return host_names_[static_cast<std::size_t>(host)];
  return fmt::format("host{}", host);
}

LinkLevel Topology::level_of(std::span<const std::int64_t> ranks) const {
  if (host_of_.empty() || ranks.empty()) return LinkLevel::domain;
  LinkLevel level = LinkLevel::domain;
  for (const std::int64_t r : ranks) {
    if (host(r) != host(ranks[0])) return LinkLevel::network;
    if (domain(r) != domain(ranks[0])) level = LinkLevel::host;
  }
  return level;
}

std::string Topology::host_sizes_text() const {
  if (host_of_.empty()) return "all";
  std::vector<int> sizes(static_cast<std::size_t>(hosts()), 0);
  for (const int h : host_of_)
    ++sizes[static_cast<std::size_t>(h)];
  return fmt::format("{}", fmt::join(sizes, ","));
}

namespace {
std::string link_text(const LinkFigures& link) {
  return fmt::format("{:g}us,{:g}GB/s", link.latency_s * 1e6, link.bandwidth_bytes_s / 1e9);
}
}  // namespace

std::string Topology::to_string() const {
  if (single_level()) return fmt::format("one host; link {}", link_text(link(LinkLevel::domain)));
  std::set<int> domains;
  for (std::int64_t r = 0; r < ranks(); ++r)
    domains.insert(domain(r));
  std::string out = fmt::format("{} hosts ({} ranks)", hosts(), host_sizes_text());
  if (!domain_of_.empty()) out += fmt::format(", {} domains", domains.size());
  out += fmt::format("; links {} {}, {} {}, {} {}", link_level_name(LinkLevel::domain),
                     link_text(link(LinkLevel::domain)), link_level_name(LinkLevel::host),
                     link_text(link(LinkLevel::host)), link_level_name(LinkLevel::network),
                     link_text(link(LinkLevel::network)));
  return out;
}

std::string Topology::key() const {
  if (single_level()) return fmt::format("1|{}", link_text(link(LinkLevel::domain)));
  return fmt::format("{}|{}|{:a},{:a},{:a},{:a},{:a},{:a}", fmt::join(host_of_, ","),
                     fmt::join(domain_of_, ","), links_[0].latency_s, links_[0].bandwidth_bytes_s,
                     links_[1].latency_s, links_[1].bandwidth_bytes_s, links_[2].latency_s,
                     links_[2].bandwidth_bytes_s);
}

GroupSpread spread_of(const Topology& topology, std::span<const std::int64_t> ranks) {
  GroupSpread spread;
  spread.level = topology.level_of(ranks);
  spread.members = static_cast<std::int64_t>(ranks.size());
  if (ranks.empty()) return spread;
  // Units: hosts when the group crosses the network, domains when it crosses domains only.
  std::map<int, std::vector<std::int64_t>> by_unit;
  for (const std::int64_t r : ranks) {
    const int unit = spread.level == LinkLevel::network ? topology.host(r) : topology.domain(r);
    by_unit[unit].push_back(r);
  }
  spread.units = static_cast<int>(by_unit.size());
  const std::size_t first = by_unit.begin()->second.size();
  spread.per_unit = static_cast<int>(first);
  spread.fewest = static_cast<int>(first);
  spread.most = static_cast<int>(first);
  for (const auto& [unit, members] : by_unit) {
    if (members.size() != first) spread.per_unit = 0;
    spread.fewest = std::min(spread.fewest, static_cast<int>(members.size()));
    spread.most = std::max(spread.most, static_cast<int>(members.size()));
    spread.inner = std::max(spread.inner, topology.level_of(members));
  }
  return spread;
}

std::vector<std::vector<int>> unit_positions(const Topology& topology,
                                             std::span<const std::int64_t> ranks) {
  const LinkLevel level = topology.level_of(ranks);
  std::map<int, std::vector<int>> by_unit;
  for (std::size_t p = 0; p < ranks.size(); ++p) {
    const std::int64_t r = ranks[p];
    const int unit = level == LinkLevel::network ? topology.host(r) : topology.domain(r);
    by_unit[unit].push_back(static_cast<int>(p));
  }
  std::vector<std::vector<int>> out;
  for (auto& [unit, positions] : by_unit)
    out.push_back(std::move(positions));
  return out;
}

double ring_seconds(RingKind kind, std::int64_t members, double bytes, const LinkFigures& link,
                    const LocalCosts& local) {
  if (members <= 1) return 0;
  const double n = static_cast<double>(members);
  const double twice = kind == RingKind::all_reduce ? 2.0 : 1.0;
  return local.per_collective_s + link.latency_s +
         twice * (n - 1) / n * bytes / link.bandwidth_bytes_s +
         twice * bytes / local.memory_bandwidth_bytes_s;
}

namespace {
// The jagged form's seconds: the inner reduce_scatter (or all_gather) of the unit with the most
// members, then one exchange across units; once for reduce_scatter and all_gather, twice (on
// bytes split over every member) for all_reduce.
double jagged_seconds(const Topology& topology, const GroupSpread& spread, RingKind kind,
                      double bytes, const LocalCosts& local, double reorder_copy_s) {
  const LinkFigures& inner = topology.link(spread.inner);
  const LinkFigures& outer = topology.link(spread.level);
  const double n = static_cast<double>(spread.members);
  const double fewest = spread.fewest;
  // A member of the smallest unit relays 1/fewest of every other unit's segments; each member
  // receives its own segment's share from every other unit.
  const double sent = (bytes - bytes * fewest / n) / fewest;
  const double received = (spread.units - 1) * bytes / n;
  const double exchange = local.per_collective_s + outer.latency_s +
                          std::max(sent, received) / outer.bandwidth_bytes_s +
                          (sent + received) / local.memory_bandwidth_bytes_s;
  const RingKind inside =
      kind == RingKind::all_gather ? RingKind::all_gather : RingKind::reduce_scatter;
  const double one_way =
      ring_seconds(inside, spread.most, bytes, inner, local) + exchange + reorder_copy_s;
  if (kind != RingKind::all_reduce) return one_way;
  return one_way + ring_seconds(RingKind::all_gather, spread.most, bytes, inner, local) + exchange +
         reorder_copy_s;
}
}  // namespace

namespace {
// The two-level form's seconds for `bytes` per member.
double two_level_seconds(const Topology& topology, const GroupSpread& spread, RingKind kind,
                         double bytes, const LocalCosts& local, double reorder_copy_s) {
  if (spread.jagged()) return jagged_seconds(topology, spread, kind, bytes, local, reorder_copy_s);
  const LinkFigures& inner = topology.link(spread.inner);
  const LinkFigures& outer = topology.link(spread.level);
  const double across = bytes / spread.per_unit;
  if (kind == RingKind::all_reduce) {
    return ring_seconds(RingKind::reduce_scatter, spread.per_unit, bytes, inner, local) +
           ring_seconds(RingKind::all_reduce, spread.units, across, outer, local) +
           ring_seconds(RingKind::all_gather, spread.per_unit, bytes, inner, local);
  }
  // `bytes` is the whole buffer: inside a unit its k members split it, across units the h
  // members split each k-th; the buffer is reordered once so that both splits are contiguous.
  return ring_seconds(kind, spread.per_unit, bytes, inner, local) +
         ring_seconds(kind, spread.units, across, outer, local) + reorder_copy_s;
}
}  // namespace

TwoLevelPrice price_two_level(const Topology& topology, const GroupSpread& spread, RingKind kind,
                              double bytes, const LocalCosts& local, double flat_copy_s,
                              double reorder_copy_s, const TwoLevelExtra& extra) {
  TwoLevelPrice price;
  price.flat_s =
      ring_seconds(kind, spread.members, bytes, topology.link(spread.level), local) + flat_copy_s;
  price.two_level_s = std::numeric_limits<double>::infinity();
  price.possible = spread.level != LinkLevel::domain && spread.units > 1 && spread.most > 1;
  if (!price.possible) return price;
  price.two_level_s = two_level_seconds(topology, spread, kind, bytes * extra.bytes_scale, local,
                                        reorder_copy_s * extra.bytes_scale) +
                      flat_copy_s;
  if (extra.key_bytes > 0) {
    // The keys agreed, then every value encoded into limbs (read once, limbs written).
    price.two_level_s +=
        two_level_seconds(topology, spread, RingKind::all_reduce, extra.key_bytes, local, 0) +
        bytes * (1 + extra.bytes_scale) / local.memory_bandwidth_bytes_s;
  }
  return price;
}

}  // namespace meshtensor
