#pragma once

#include <cstdint>
#include <vector>

#include <meshtensor/mesh/layout.hpp>
#include <meshtensor/plan/plan.hpp>

namespace meshtensor::plan {

/// One rank's group of a step: its size, the rank's position, and any member's mesh rank,
/// computed on demand (O(mesh dims) each) instead of stored, so that nothing per rank grows with
/// the group squared.
class StepGroup {
 public:
  /// The group of `rank` over `dims` (major to minor).
  StepGroup(const DeviceMesh& mesh, const std::vector<int>& dims, std::int64_t rank);
  /// Number of members.
  std::int64_t size() const { return size_; }
  /// The rank's position in the group.
  std::int64_t position() const { return position_; }
  /// Mesh rank of the member at `position`.
  std::int64_t member(std::int64_t position) const;

 private:
  const DeviceMesh& mesh_;
  std::vector<int> dims_;
  std::vector<std::int64_t> coordinates_;  // of the rank; the group dims are overwritten
  std::int64_t size_ = 1;
  std::int64_t position_ = 0;
};

/// Element count of every member's block under `spec`, in group order.
std::vector<std::int64_t> member_counts(const DeviceMesh& mesh, const std::vector<int>& group,
                                        const PlacementSpec& spec, const Shape& shape,
                                        std::int64_t rank);

/// Every member's block under `spec`, in group order (what a pack or unpack of the members'
/// pieces needs).
std::vector<Layout> member_blocks(const DeviceMesh& mesh, const std::vector<int>& group,
                                  const PlacementSpec& spec, const Shape& shape, std::int64_t rank);

/// How one rank moves data in an all_to_all step: element counts to and from every member
/// (group order) and the non-empty pieces, in member order.
///
/// Blocks that several members hold alike (the step's dims include non-Shard ones in `before`)
/// are sent by one of them only: the receiver itself when it holds the piece, otherwise the
/// holder whose index among the holders (in group order) is the receiver's position modulo their
/// number. Every rank derives the same choice.
struct GroupExchange {
  std::int64_t position = 0;              ///< this rank's position in the group
  std::vector<std::int64_t> send_counts;  ///< elements this rank sends to each member
  std::vector<std::int64_t> recv_counts;  ///< elements it receives from each member
  std::vector<Layout> send;               ///< the non-empty pieces of its block it sends
  std::vector<Layout> recv;               ///< the non-empty pieces of its new block it receives
};

/// The exchange of `rank`'s group in a data-moving `step` of a tensor of `shape` on `mesh`.
/// O(group size) time; memory: the counts and the non-empty pieces.
GroupExchange group_exchange(const DeviceMesh& mesh, const Step& step, const Shape& shape,
                             std::int64_t rank);

/// Elements `rank` sends to and receives from other members in an all_to_all `step` (its own
/// piece excluded): closed forms where every block has one holder, a walk over the receivers it
/// serves otherwise.
struct ExchangeVolume {
  std::int64_t send = 0;
  std::int64_t recv = 0;
};
ExchangeVolume exchange_volume(const DeviceMesh& mesh, const Step& step, const Shape& shape,
                               std::int64_t rank);

}  // namespace meshtensor::plan
