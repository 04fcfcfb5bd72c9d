#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <meshtensor/comm/communicator.hpp>

namespace meshtensor::comm {

namespace detail {
struct ThreadsShared;
}

/// Most ranks a threads world runs.
inline constexpr int kMaxThreadsRanks = 4096;

/// Extra wall time a collective takes on a simulated link, given the call and its group's world
/// ranks: the rank's queue sleeps that long after moving the data (in memory), so communication
/// takes time without taking a core, as it would on a network.
using LinkDelay = std::function<std::chrono::nanoseconds(const CollectiveCall& call,
                                                         const std::vector<std::int64_t>& ranks)>;

/// Bytes one rank moves over its link for `call` on a group of `size` ranks with ring-style
/// algorithms: all_gather and reduce_scatter (n-1)/n of the whole buffer, all_reduce twice that,
/// broadcast the buffer, all_to_all (n-1)/n of the larger of what the rank sends and receives
/// (the self part is not in the call; an even exchange holds 1/n there); 0 on a single rank.
std::int64_t link_bytes(const CollectiveCall& call, int size);

/// The link every group of the world sits on: `latency` per collective plus link_bytes() at
/// `bytes_per_second`; a group of one rank communicates nothing and takes no time.
LinkDelay simulated_link(std::chrono::nanoseconds latency, double bytes_per_second);

/// Parses "LATENCY,GBPS": latency with a unit (ns, us, ms or s; a bare number is microseconds)
/// and bandwidth in GB/s (1e9 bytes), e.g. "20us,10". ParseError naming the text otherwise.
LinkDelay parse_link(const std::string& text);

/// What a threads world simulates: a link delay for every collective and where the ranks sit.
/// Converts from a LinkDelay alone (one host).
struct SimulatedNetwork {
  SimulatedNetwork() = default;
  SimulatedNetwork(
      LinkDelay link_delay)  // NOLINT(google-explicit-constructor): a link is a network
      : link(std::move(link_delay)) {}
  /// Ranks placed by `topology`; `link_delay` (may be empty) charges each collective.
  SimulatedNetwork(LinkDelay link_delay, Topology where)
      : link(std::move(link_delay)), topology(std::move(where)) {}

  LinkDelay link;     ///< delays every collective; empty: no delay
  Topology topology;  ///< what Communicator::topology() reports
};

/// The links of `topology`, each collective charged on the outermost level its group crosses:
/// that level's latency plus link_bytes() at its bandwidth.
LinkDelay simulated_topology_link(const Topology& topology);

/// All ranks of a job as threads of one process, exchanging through shared memory. Each rank's
/// collectives run on a queue of its own per group; a collective's calls are compared across
/// ranks before any data moves (a mismatch is a DesyncError on every rank, never a hang).
class ThreadsWorld {
 public:
  /// A world of `size` ranks (1 to kMaxThreadsRanks); `link`, when set, delays every collective
  /// of every group as a network would.
  explicit ThreadsWorld(int size, SimulatedNetwork network = {});
  /// Number of ranks.
  int size() const;
  /// The communicator of the whole world for `rank`. Call once per rank and use it from that
  /// rank's thread.
  std::shared_ptr<Communicator> communicator(int rank) const;
  /// Fails every pending and future collective of this world with CommError carrying `reason`.
  void abort(const std::string& reason) const;
  /// Marks `rank` as gone (its work returned): collectives that wait for it fail at once with
  /// CommError naming it, and its own later collectives fail too.
  void leave(int rank) const;

 private:
  std::shared_ptr<detail::ThreadsShared> shared_;
};

/// Runs `body(world communicator)` on `size` threads, one per rank, and returns when all
/// finished. A rank whose body returns has left: a collective that waits for it fails at once
/// with CommError naming it, rather than at its deadline. When a rank throws, the world aborts with
/// that rank's error as the cause (the other ranks' collectives fail with CommError naming it) and
/// the first error is rethrown here. A thread that cannot be started (a process or memory limit)
/// fails the world the same way and throws ResourceError naming the rank.
void run_threads(int size, const std::function<void(Communicator&)>& body,
                 SimulatedNetwork network = {});
/// The same, handing each rank its communicator as a shared handle, for bodies that keep it
/// beyond the call (a language binding's objects): the rank's queue drains when the last handle
/// goes.
void run_threads(int size, const std::function<void(std::shared_ptr<Communicator>)>& body,
                 SimulatedNetwork network = {});
/// The same, calling `poll` on the calling thread about every 50 ms while the ranks run (a
/// language binding checks for Ctrl-C there). When `poll` throws, the world aborts naming its
/// error (collectives fail at once with CommError), every rank is joined and that exception is
/// rethrown.
void run_threads(int size, const std::function<void(std::shared_ptr<Communicator>)>& body,
                 SimulatedNetwork network, const std::function<void()>& poll);

}  // namespace meshtensor::comm
