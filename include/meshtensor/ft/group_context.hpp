#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <meshtensor/ft/coordinator.hpp>

namespace gloo {
class Context;
}

namespace meshtensor::ft {

/// The cross-group data plane of one quorum: a Gloo context over TCP among the quorum's
/// members, one per shard position (`tag`), met through the coordinator's store under the
/// quorum's id. Every operation waits at most `timeout` seconds; a lost or silent peer makes it
/// throw CommError naming the operation, and the context is spent: the caller asks for a new
/// quorum and builds another.
class GroupContext {
 public:
  /// Collective over the quorum's members (`group` must be one), who meet through the store of
  /// the coordinator at `coordinator` ("HOST:PORT"). `hostname`: the address the other groups
  /// reach this one at. CommError naming the quorum when the members do not all meet within
  /// the timeout.
  GroupContext(const std::string& coordinator, std::int64_t group, const Quorum& quorum,
               const std::string& tag, const std::string& hostname, double timeout);
  ~GroupContext();
  GroupContext(const GroupContext&) = delete;
  GroupContext& operator=(const GroupContext&) = delete;

  /// This group's place among the members (ascending group order), and their number.
  int rank() const { return rank_; }
  int size() const { return size_; }
  /// The quorum the context serves.
  const Quorum& quorum() const { return quorum_; }

  /// Sums `values` over the members in place: integer sums, the same bits whatever the order
  /// (exact mode's digits).
  void all_reduce_sum(std::span<std::int64_t> values);
  /// Replaces `bytes` on every member with the bytes of the member at `root` (in pieces of 32
  /// MiB, each within the timeout).
  void broadcast(std::span<char> bytes, int root);
  /// Every member's `bytes` (of one length on every member), in member order.
  std::vector<char> all_gather(std::span<const char> bytes);
  /// Member r's `input` (counts[r] bytes) into `output` at r's place, for every member.
  void all_gather_bytes(std::span<const char> input, std::span<char> output,
                        const std::vector<std::int64_t>& counts);
  /// Sends send_counts[r] bytes of `input` (in member order) to each member r and receives
  /// recv_counts[r] bytes from each into `output` (in member order).
  void all_to_all_bytes(std::span<const char> input, const std::vector<std::int64_t>& send_counts,
                        std::span<char> output, const std::vector<std::int64_t>& recv_counts);
  /// Waits for every member.
  void barrier();
  /// The timeout of the operations that follow (seconds).
  void set_timeout(double seconds) { timeout_ = seconds; }
  /// The timeout operations wait at most (seconds).
  double timeout() const { return timeout_; }

 private:
  /// Runs a Gloo operation, turning its failures into CommError naming `what`.
  template <typename Operation>
  void guarded(const char* what, Operation operation);

  Quorum quorum_;
  std::string tag_;
  int rank_ = 0;
  int size_ = 1;
  double timeout_;
  std::shared_ptr<gloo::Context> context_;
};

}  // namespace meshtensor::ft
