#pragma once

// What `meshtensor bench collective|redistribute|matmul|plan` print: text tables or JSON of
// the timings collective_bench, redistribute_bench and matmul_bench measure.

#include <string>
#include <vector>

#include <meshtensor/comm/communicator.hpp>

#include "collective_bench.hpp"
#include "redistribute_bench.hpp"

namespace meshtensor::bench {

/// How a collective sweep reports.
struct CollectiveReport {
  bool json = false;    ///< one JSON object per configuration
  std::string backend;  ///< "threads" or "mpi", as reported
  bool threads = true;  ///< all ranks are threads of this process (memory checks, the bound)
};

/// Times every configuration on `world` (call it on every rank; each configuration is refused
/// first when this machine's ranks could not hold it) and prints on rank 0: one configuration
/// with one mode in words (with the memory bound on threads), several as one table.
void report_collectives(comm::Communicator& world,
                        const std::vector<CollectiveBenchConfig>& configs,
                        const CollectiveReport& report);

/// How `bench redistribute` reports.
struct RedistributeReport {
  bool json = false;
  std::string mode;            ///< as given
  std::string backend;         ///< as given
  std::string ranks_per_host;  ///< as given (topology runs)
};

/// Prints one `bench redistribute` result.
void print_redistribute(const RedistributeReport& report, const RedistributeBenchConfig& config,
                        const RedistributeBenchResult& result, const PlanningTime& planning);

/// Times and prints the matmul forms against OpenBLAS and the exact weight gradient against the
/// ordered one (`iterations` timed calls per row; 0: about 0.3 s worth).
void report_matmul(bool json, int iterations);

/// Times and prints planning, uncached and cached, for meshes from 1-D to 4-D.
void report_planning(bool json);

}  // namespace meshtensor::bench
