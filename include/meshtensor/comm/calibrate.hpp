#pragma once

#include <meshtensor/comm/communicator.hpp>
#include <meshtensor/mesh/topology.hpp>

namespace meshtensor::comm {

/// What one collective and one rank's copies cost on this machine while every rank of `world`
/// runs: the median of timed barriers of the whole world (a collective's start-up and
/// synchronisation) and the median bandwidth of a 2 MiB copy, each the slowest rank's. Agreed
/// over `world` (a max-reduction), so every rank gets the same figures. Collective on `world`.
LocalCosts measure_local_costs(Communicator& world);

}  // namespace meshtensor::comm
