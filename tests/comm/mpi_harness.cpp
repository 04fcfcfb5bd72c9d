// Test main for the mpi backend: every process of the mpirun job runs the same tests in the same
// order, so each run_world() is a collective step of the whole job.
#include <iostream>
#include <map>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <meshtensor/comm/mpi_backend.hpp>

#include "comm/harness.hpp"

namespace meshtensor::testing {

namespace {

comm::MpiWorld* job = nullptr;
// Sub-world of the first `size` processes, made once per size (null on the other processes).
std::map<int, std::shared_ptr<comm::Communicator>> worlds_by_size;

// Ranks other than 0 report failures only, each line tagged with the rank.
class FailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::cerr << fmt::format("[rank {}] {}:{}: {}\n", rank_,
                             result.file_name() ? result.file_name() : "?", result.line_number(),
                             result.summary());
  }

 private:
  int rank_;
};

}  // namespace

void run_world(int size, const std::function<void(comm::Communicator&)>& body) {
  if (size > job->size()) {
    // Other sizes of the same test may still run; say what was left out.
    if (job->rank() == 0) {
      std::cout << fmt::format(
          "[   NOTE   ] {}: the {}-rank case needs a larger job (this one has {})\n",
          ::testing::UnitTest::GetInstance()->current_test_info()->name(), size, job->size());
    }
    return;
  }
  auto found = worlds_by_size.find(size);
  if (found == worlds_by_size.end()) {
    const int rank = job->rank();
    found = worlds_by_size.emplace(size, job->communicator()->split(rank < size ? 0 : -1, rank, {}))
                .first;
  }
  if (!found->second) return;
  try {
    body(*found->second);
  } catch (const std::exception& error) {
    // The other ranks would wait for this one in their next collective: stop the job instead.
    job->abort(fmt::format("world rank {} threw in a test body: {}", job->rank(), error.what()));
  }
}

std::string_view backend_under_test() {
  return "mpi";
}

}  // namespace meshtensor::testing

int main(int argc, char** argv) {
  using meshtensor::testing::job;
  meshtensor::comm::MpiWorld world(&argc, &argv);
  job = &world;
  ::testing::InitGoogleTest(&argc, argv);
  if (world.rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new meshtensor::testing::FailurePrinter(world.rank()));
  }
  const int result = RUN_ALL_TESTS();
  // Every process exits with the job's verdict.
  meshtensor::Tensor verdict =
      meshtensor::Tensor::full({1}, meshtensor::DType::i32, static_cast<double>(result));
  world.communicator()->all_reduce(verdict, {.op = meshtensor::ReduceOp::max});
  meshtensor::testing::worlds_by_size.clear();
  return verdict.values<std::int32_t>()[0];
}
