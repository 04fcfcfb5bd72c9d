#pragma once

#include <mutex>
#include <vector>

#include <gtest/gtest.h>

#include <meshtensor/comm/threads_backend.hpp>
#include <meshtensor/train/trainer.hpp>

namespace meshtensor::testing {

/// train() of `task` on `ranks` thread ranks; expects every rank to end on rank 0's digest and
/// returns rank 0's result.
inline train::TrainResult train_on_threads(const train::Task& task,
                                           const train::TrainConfig& config, int ranks) {
  std::mutex mutex;
  std::vector<train::TrainResult> results(static_cast<std::size_t>(ranks));
  comm::run_threads(ranks, [&](comm::Communicator& world) {
    train::TrainResult result = train::train(world, task, config);
    const std::lock_guard lock(mutex);
    results[static_cast<std::size_t>(world.rank())] = result;
  });
  for (const auto& r : results)
    EXPECT_EQ(r.digest, results.front().digest);
  return results.front();
}

}  // namespace meshtensor::testing
