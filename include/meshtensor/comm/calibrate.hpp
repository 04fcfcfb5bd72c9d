#pragma once

#include <meshtensor/comm/communicator.hpp>
#include <meshtensor/mesh/topology.hpp>

namespace meshtensor::comm {

/// What one collective and one rank's copies cost on this machine while every rank of `world`
/// runs: the median of timed barriers of the whole world (a collective's start-up and
/// synchronisation), and a rank's copy bandwidth when every rank copies 4 MiB at once (the
/// median time from a barrier through the copies to the next barrier, less the barriers; ranks
/// that share cores divide it). The slowest rank's figures, agreed over `world` by a
/// max-reduction, so every rank gets the same. Collective on `world`.
LocalCosts measure_local_costs(Communicator& world);

}  // namespace meshtensor::comm
