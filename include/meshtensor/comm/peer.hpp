#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <meshtensor/comm/communicator.hpp>
#include <meshtensor/comm/work_queue.hpp>

namespace meshtensor::comm {

/// One direction between two members of a group that messages may take: `sender` to
/// `receiver` (group ranks), told apart from other links between the same pair by `tag`.
struct PeerLink {
  int sender = 0;
  int receiver = 0;
  std::int64_t tag = 0;
  bool operator==(const PeerLink&) const = default;
};

/// One point-to-point operation of a batch (batch_isend_irecv): send `tensor` to `peer`, or
/// receive into it from `peer`, on the link with `tag`.
struct PeerOp {
  enum class Kind : std::uint8_t { send, recv };
  Kind kind = Kind::send;
  Tensor tensor;
  int peer = 0;
  std::int64_t tag = 0;
  std::string label;  ///< what the message is (part of the match and of every error)
};

/// Point-to-point messages between the members of a group, on links declared up front. Each link
/// is a two-member group of its own (a split of `group`) with its own FIFO queue, so a message
/// is a collective of the two ends: it runs on both backends, in order with the link's other
/// messages, under the collectives' timeouts and checks. A send and the receive it meets must
/// agree on dtype, element count and label (a DesyncError naming both sides otherwise, on both
/// ranks); a send nobody receives ends in the timeout's CommError, never a hang. Sends do not
/// wait for the receiver: the link's queue delivers them in order.
class PeerChannels {
 public:
  /// Collective over `group`: every member passes the same links in the same order. Links need
  /// two different members in range; a repeated link is an InvalidArgument naming it.
  PeerChannels(Communicator& group, std::vector<PeerLink> links,
               const CollectiveOptions& options = {});

  /// Queues the send of `tensor` (contiguous; untouched until the work completes) to `peer`.
  Work isend(const Tensor& tensor, int peer, std::int64_t tag, std::string label = {});
  /// Queues the receive into `tensor` (contiguous, of the dtype and element count sent).
  Work irecv(const Tensor& tensor, int peer, std::int64_t tag, std::string label = {});
  /// Blocking send.
  void send(const Tensor& tensor, int peer, std::int64_t tag, std::string label = {});
  /// Blocking receive.
  void recv(const Tensor& tensor, int peer, std::int64_t tag, std::string label = {});
  /// Queues every operation in order and returns their works (PyTorch's batch_isend_irecv).
  std::vector<Work> batch_isend_irecv(const std::vector<PeerOp>& ops);

  /// This rank's position in the group.
  int rank() const { return rank_; }
  /// Members of the group.
  int size() const { return size_; }
  /// The links.
  const std::vector<PeerLink>& links() const { return links_; }

 private:
  /// Index of the link (sender, receiver, tag) this rank is an end of; InvalidArgument naming
  /// it when there is none.
  std::size_t link_index(int sender, int receiver, std::int64_t tag, const char* what) const;
  /// Runs one message on its link (on the link's queue, or inline when blocking).
  void transfer(std::size_t link, const Tensor& tensor, const std::string& label) const;
  Work post(const Tensor& tensor, int peer, std::int64_t tag, bool sending, std::string label,
            bool blocking);

  int rank_ = 0;
  int size_ = 0;
  bool exchange_headers_ = false;
  std::chrono::milliseconds timeout_;
  std::vector<PeerLink> links_;
  std::vector<std::shared_ptr<Communicator>>
      groups_;                                      // per link; null where this rank is neither end
  std::vector<std::unique_ptr<WorkQueue>> queues_;  // per link: its messages, in order
};

}  // namespace meshtensor::comm
