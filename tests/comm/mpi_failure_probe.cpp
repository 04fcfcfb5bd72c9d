// Failure scenarios of the mpi backend, one per run (`mpirun -np 2 mpi_failure_probe <scenario>`):
// each must end the whole job with a non-zero status and a message naming the cause.
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <iostream>
#include <new>
#include <string_view>
#include <thread>

#include <meshtensor/comm/mpi_backend.hpp>
#include <meshtensor/comm/peer.hpp>
#include <meshtensor/core/error.hpp>

using namespace meshtensor;

int main(int argc, char** argv) {
  const std::string_view scenario = argc > 1 ? argv[1] : "";
  if (scenario == "late_start") {
    // Rank 1 is lost before it starts MPI (mpirun set its rank already): rank 0 waits inside
    // MPI_Init_thread, and the start watchdog must end it within the timeout.
    const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
    if (rank != nullptr && std::string_view(rank) == "1")
      std::this_thread::sleep_for(std::chrono::seconds(25));
  }
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
        } else if (scenario == "peer_mismatch") {
          // A 4-element send meets an 8-element receive on a point-to-point link: both sides
          // named, no hang (the header travels first without check mode).
          comm::PeerChannels links(world, {{0, 1, 0}});
          if (world.rank() == 0) {
            links.send(Tensor::zeros({4}, DType::f32), 1, 0, "activation 0");
          } else {
            Tensor wrong({8}, DType::f32);
            links.recv(wrong, 0, 0, "activation 0");
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
        } else if (scenario == "timeout_default") {
          // As "timeout", with the timeout from MESHTENSOR_TIMEOUT.
          if (world.rank() == 1) {
            std::this_thread::sleep_for(std::chrono::seconds(20));
          } else {
            world.barrier();
          }
        } else if (scenario == "modes_small" || scenario == "modes_large") {
          // Without check mode, rank 1 runs exact where rank 0 runs ordered: never a silent
          // result. A small buffer is refused at once, a large one times out naming both calls.
          const std::int64_t count = scenario == "modes_small" ? 4 : 1 << 20;
          Tensor buffer = Tensor::zeros({count}, DType::f32);
          world.all_reduce(buffer, {.mode = world.rank() == 1 ? comm::ReductionMode::exact
                                                              : comm::ReductionMode::ordered,
                                    .timeout = std::chrono::milliseconds(1000)});
        } else if (scenario == "stopped") {
          // Rank 1 is stopped (as by a debugger or the scheduler) before the barrier: it can
          // answer nothing, and the others' timeout must say so.
          if (world.rank() == 1) std::raise(SIGSTOP);
          world.barrier({.timeout = std::chrono::milliseconds(500)});
        } else if (scenario == "late_start") {
          world.barrier();
        } else if (scenario == "chain") {
          // On 3 ranks, a chain as pipeline stages make: rank 0 waits for rank 1 on {0, 1},
          // rank 1 for rank 2 on {1, 2}, and rank 2 is stopped. Rank 0's timeout must say that
          // rank 1 is itself waiting, on {1, 2}.
          const comm::CollectiveOptions wait{.timeout = std::chrono::seconds(10)};
          const int r = world.rank();
          auto first = world.split(r == 2 ? -1 : 0, r, wait);
          auto second = world.split(r == 0 ? -1 : 0, r, wait);
          if (r == 2) std::raise(SIGSTOP);
          if (r == 1) second->barrier(wait);
          if (r == 0) first->barrier({.timeout = std::chrono::milliseconds(500)});
        } else if (scenario == "killed") {
          // Rank 1 dies: the job ends at once, not after the 5-minute default timeout.
          if (world.rank() == 1) std::raise(SIGKILL);
          world.barrier();
        } else if (scenario == "bad_alloc") {
          // Rank 1 runs out of memory: the job ends with that cause.
          if (world.rank() == 1) throw std::bad_alloc();
          world.barrier();
        } else {
          throw InvalidArgument(
              "scenario must be desync, timeout, timeout_default, throw, modes_small, "
              "modes_large, stopped, killed or bad_alloc");
        }
        std::cout << "scenario finished without an error\n";
      },
      options);
}
