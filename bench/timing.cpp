#include "timing.hpp"

#include <cstdlib>
#include <iostream>
#include <string_view>

#include <meshtensor/kernels/simd.hpp>

namespace meshtensor::bench {

void print_machine_line(bool json) {
  const char* mpi_rank = std::getenv("OMPI_COMM_WORLD_RANK");  // one line for an mpirun job
  if (json || (mpi_rank != nullptr && std::string_view(mpi_rank) != "0")) return;
  std::cout << "machine: " << kernels::machine_description() << '\n';
}

}  // namespace meshtensor::bench
