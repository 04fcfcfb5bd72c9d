#pragma once

#include <span>

#include <meshtensor/comm/communicator.hpp>

namespace meshtensor::comm {

/// All-reduce of `buffer` over the product of several groups, one step per group in the order
/// given (for a mesh: the groups along single mesh dims, any order). In `exact` mode the steps
/// keep the fixed-point form and round once at the end, so the bits equal one exact all_reduce
/// over the flattened group; `avg` divides once by the product of the group sizes. In the other
/// modes each step is an all_reduce of its own (`avg` per step).
void all_reduce_chain(std::span<Communicator* const> groups, const Tensor& buffer,
                      const CollectiveOptions& options = {});

}  // namespace meshtensor::comm
