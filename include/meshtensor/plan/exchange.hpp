#pragma once

#include <cstdint>
#include <vector>

#include <meshtensor/mesh/layout.hpp>
#include <meshtensor/plan/plan.hpp>

namespace meshtensor::plan {

/// How one rank's group moves data in a step: every member's block before and after, and the
/// pieces this rank sends to and receives from each member (member order = group order).
///
/// Blocks that several members hold alike (the step's dims include Replicate ones) are sent by
/// one of them only: the receiver itself when it holds the piece, otherwise the holder at
/// position (receiver position mod holders). Every rank derives the same choice.
struct GroupExchange {
  std::vector<std::int64_t> members;  ///< mesh ranks, group order
  int position = 0;                   ///< this rank's index in members
  std::vector<Layout> before;         ///< each member's block before the step
  std::vector<Layout> after;          ///< each member's block after it
  std::vector<Layout> send;           ///< piece of before[position] for each member (may be empty)
  std::vector<Layout> recv;           ///< piece of after[position] from each member (may be empty)
};

/// The exchange of `rank`'s group in a data-moving `step` of a tensor of `shape` on `mesh`.
GroupExchange group_exchange(const DeviceMesh& mesh, const Step& step, const Shape& shape,
                             std::int64_t rank);

}  // namespace meshtensor::plan
