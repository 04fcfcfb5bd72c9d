#include "timing.hpp"

#include <cstdlib>
#include <iostream>
#include <string_view>

#include <fmt/format.h>

#include <meshtensor/kernels/peak.hpp>
#include <meshtensor/kernels/simd.hpp>

namespace meshtensor::bench {

std::string measured_peak_text() {
  static const std::string text = [] {
    const kernels::SimdLevel level = kernels::simd_level();
    return fmt::format("f32 FMA peak {:.0f} GFLOP/s a core at {} (measured; bench peak)",
                       kernels::measured_fma_peak_per_core() / 1e9,
                       kernels::simd_level_name(level));
  }();
  return text;
}

void print_machine_line(bool json) {
  const char* mpi_rank = std::getenv("OMPI_COMM_WORLD_RANK");  // one line for an mpirun job
  if (json || (mpi_rank != nullptr && std::string_view(mpi_rank) != "0")) return;
  std::cout << "machine: " << kernels::machine_description() << ", " << measured_peak_text()
            << '\n';
}

}  // namespace meshtensor::bench
