#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include <meshtensor/ft/quorum.hpp>

namespace meshtensor::ft {

/// Where and how the coordinator runs (`meshtensor coordinator`).
struct CoordinatorConfig {
  std::string host = "0.0.0.0";  ///< the address to listen on
  std::uint16_t port = 29500;    ///< 0: any free port (port() tells which)
  QuorumRules rules;
};

/// The coordinator of a fault-tolerant run: replica groups join it, send heartbeats, ask for a
/// quorum each step, and meet through its key-value store (the rendezvous of their cross-group
/// contexts). One JSON object a line over TCP each way (docs/fault-tolerance.md has the
/// protocol). Its state is soft: a restarted coordinator learns the run again from the groups'
/// joins and asks.
class Coordinator {
 public:
  /// Listens; CommError naming the address when it cannot.
  explicit Coordinator(CoordinatorConfig config);
  /// Stops and joins every thread.
  ~Coordinator();
  Coordinator(const Coordinator&) = delete;
  Coordinator& operator=(const Coordinator&) = delete;

  /// The port it listens on.
  std::uint16_t port() const { return port_; }
  /// Serves connections until stop(), on a thread of its own.
  void start();
  /// Closes every connection and stops serving.
  void stop();
  /// Live groups, ascending.
  std::vector<std::int64_t> live_groups();
  /// The last quorum formed (id 0: none yet).
  Quorum last_quorum();

 private:
  struct Connection;
  void accept_loop();
  void serve(const std::shared_ptr<Connection>& connection);
  std::string answer(Connection& connection, const std::string& line);
  std::string answer_quorum(std::int64_t group, const std::string& incarnation, std::int64_t step,
                            double timeout, bool fresh);
  std::string answer_get(const std::string& key, double timeout);
  double now() const;

  CoordinatorConfig config_;
  std::string incarnation_;  // unique per start: quorums name it
  int listener_ = -1;
  std::uint16_t port_ = 0;
  std::atomic<bool> stopping_{false};
  std::thread acceptor_;
  std::mutex mutex_;
  std::condition_variable changed_;
  QuorumState state_;
  /// Each group's quorum, formed but not yet taken by its waiting ask.
  std::map<std::int64_t, Quorum> delivered_;
  std::map<std::string, std::string> store_;
  std::vector<std::shared_ptr<Connection>> connections_;
  std::int64_t connections_made_ = 0;  // accept loop only
  std::vector<std::thread> workers_;
};

/// `meshtensor coordinator`: blocks SIGTERM and SIGINT (so no thread of it takes one), serves,
/// says on `log` where it listens, and stops when one of them arrives.
void serve_until_signalled(const CoordinatorConfig& config, std::ostream& log);

/// The coordinator's key-value store over a connection of its own, without joining: what each
/// rank of a group uses to meet the other groups' ranks. Calls from several threads are served
/// one at a time.
class StoreClient {
 public:
  /// Connects to "HOST:PORT"; CommError naming the address when it cannot within `timeout`
  /// seconds.
  StoreClient(const std::string& address, double timeout);
  ~StoreClient();
  StoreClient(const StoreClient&) = delete;
  StoreClient& operator=(const StoreClient&) = delete;
  /// Stores `value` under `key`.
  void set(const std::string& key, const std::string& value);
  /// The value of `key`, waiting up to `timeout` seconds for it to be set (TimeoutError naming
  /// the key otherwise).
  std::string get(const std::string& key, double timeout);
  /// The numeric address this process reaches the coordinator from.
  std::string local_host();

 private:
  struct Link;
  std::string address_;
  double timeout_;
  std::unique_ptr<Link> link_;
  std::mutex mutex_;
};

/// A replica group's link to the coordinator: joins on construction and keeps sending
/// heartbeats on a connection of its own until destroyed. A group the coordinator dropped (a
/// stop past its heartbeat timeout), or a coordinator that restarted, is met by joining again
/// under the same incarnation at the next ask.
class CoordinatorClient {
 public:
  /// Connects to "HOST:PORT" and joins as `group` of the run `shape`; CommError naming the
  /// address when it cannot connect within `timeout` seconds, DataError with the coordinator's
  /// reason when it refuses the join (another model or layout, a group live already).
  CoordinatorClient(const std::string& address, std::int64_t group, const RunShape& shape,
                    double timeout);
  ~CoordinatorClient();
  CoordinatorClient(const CoordinatorClient&) = delete;
  CoordinatorClient& operator=(const CoordinatorClient&) = delete;
  /// Waits for the quorum of `step` (at most `timeout` seconds; TimeoutError naming the step).
  /// `fresh`: this group's contexts failed, the quorum must have a new id. Joins again first
  /// when the coordinator no longer counts the group live; reconnects while the coordinator is
  /// unreachable (CommError naming it when it stays so for `timeout`).
  Quorum quorum(std::int64_t step, double timeout, bool fresh = false);
  /// One try of quorum(): nullopt when the coordinator cannot be reached now (unreachable()
  /// says why); TimeoutError naming the step when it answers that no quorum formed in time.
  /// Call from one thread.
  std::optional<Quorum> try_quorum(std::int64_t step, double timeout, bool fresh = false);
  /// Why the last try could not reach the coordinator.
  const std::string& unreachable() const { return unreachable_; }
  /// Stores `value` under `key` (the rendezvous of the quorum's contexts).
  void set(const std::string& key, const std::string& value);
  /// The value of `key`, waiting up to `timeout` seconds for it to be set.
  std::string get(const std::string& key, double timeout);
  /// This process's incarnation (unique per process start).
  const std::string& incarnation() const { return incarnation_; }
  /// The group this client joined as.
  std::int64_t group() const { return group_; }
  /// The coordinator's "HOST:PORT".
  const std::string& address() const { return address_; }
  /// The numeric address this process reaches the coordinator from: by default the address
  /// the other groups reach it at.
  std::string local_host();

 private:
  struct Link;
  /// Connects the control link and joins (DataError when refused).
  void join(double timeout);
  std::string request(const std::string& line, double timeout);
  void beat();
  std::string address_;
  std::int64_t group_;
  RunShape shape_;
  std::string incarnation_;
  double timeout_;
  std::string unreachable_;
  std::mutex request_mutex_;  // one request at a time on the control link
  std::unique_ptr<Link> control_;
  std::mutex mutex_;
  std::condition_variable stop_;
  bool stopping_ = false;
  std::thread beater_;
};

/// A quorum as one line of text (what a group's first rank hands its other ranks), and back.
std::string quorum_text(const Quorum& quorum);
/// The quorum of quorum_text(); DataError naming what is wrong with damaged text.
Quorum parse_quorum(const std::string& text);

}  // namespace meshtensor::ft
