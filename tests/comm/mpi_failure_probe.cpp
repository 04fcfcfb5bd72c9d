// Failure scenarios of the mpi backend, one per run (`mpirun -np 2 mpi_failure_probe <scenario>`):
// each must end the whole job with a non-zero status and a message naming the cause.
#include <chrono>
#include <iostream>
#include <string_view>
#include <thread>

#include <meshtensor/comm/mpi_backend.hpp>
#include <meshtensor/core/error.hpp>

using namespace meshtensor;

int main(int argc, char** argv) {
  const std::string_view scenario = argc > 1 ? argv[1] : "";
  comm::MpiOptions options;
  options.check_collectives = scenario == "desync";
  return comm::run_mpi(
      &argc, &argv,
      [&](comm::Communicator& world) {
        if (scenario == "desync") {
          // Rank 1 issues a different collective: check mode names both sides.
          if (world.rank() == 1) {
            world.all_gather(Tensor({4}, DType::f32), Tensor({8}, DType::f32));
          } else {
            Tensor buffer({4}, DType::f32);
            world.all_reduce(buffer);
          }
        } else if (scenario == "timeout") {
          // Rank 1 never joins the barrier.
          if (world.rank() == 1) {
            std::this_thread::sleep_for(std::chrono::seconds(20));
          } else {
            world.barrier({.timeout = std::chrono::milliseconds(300)});
          }
        } else if (scenario == "throw") {
          if (world.rank() == 1) throw InvalidArgument("rank one gave up");
          world.barrier();
        } else {
          throw InvalidArgument("scenario must be desync, timeout or throw");
        }
        std::cout << "scenario finished without an error\n";
      },
      options);
}
