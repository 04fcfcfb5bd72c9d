// The context-parallel group: each rank's rows of a sequence, and the gather that puts every
// member's rows back at their positions; a GPT on cp ranks gives the logits of whole sequences.
#include <cstring>
#include <mutex>
#include <vector>

#include <gtest/gtest.h>

#include <meshtensor/comm/threads_backend.hpp>
#include <meshtensor/core/error.hpp>
#include <meshtensor/cp/context_parallel.hpp>
#include <meshtensor/nn/gpt.hpp>

namespace meshtensor::cp {
namespace {

TEST(ContextParallel, LocalRowsAndGatherRoundTripEveryPosition) {
  const std::int64_t length = 16;  // over cp 3: 6 chunks of 3, the last of 1
  const Tensor whole = Tensor::random_normal(Shape{2, length, 5}, DType::f32, 7);
  comm::run_threads(3, [&](std::shared_ptr<comm::Communicator> world) {
    ContextParallel split(world);
    split.set_length(length);
    const Tensor local = split.local_rows(whole);
    ASSERT_EQ(local.shape()[1], static_cast<std::int64_t>(split.positions().size()));
    for (std::size_t i = 0; i < split.positions().size(); ++i) {
      const std::int64_t t = split.positions()[i];
      EXPECT_EQ(local.narrow(1, static_cast<std::int64_t>(i), 1).contiguous().digest(),
                whole.narrow(1, t, 1).contiguous().digest());
    }
    EXPECT_EQ(split.gather(local).digest(), whole.digest());
    EXPECT_THROW(split.gather(whole), InvalidArgument);  // rows of the wrong count
    EXPECT_THROW(split.set_length(5), InvalidArgument);  // 6 chunks of 1 leave the last empty
  });
}

TEST(ContextParallel, GptLogitsOnCpRanksAreTheWholeSequencesBits) {
  nn::GptConfig config;
  config.layers = 2;
  config.heads = 2;
  config.dim = 16;
  config.context = 22;
  const Tensor tokens = Tensor::random_int(Shape{3, 22}, DType::i64, 5, 0, 256);
  nn::Gpt whole(config);
  const Tensor expected = whole.forward(tokens);
  for (const int degree : {2, 3, 4}) {
    std::mutex mutex;
    comm::run_threads(degree, [&](std::shared_ptr<comm::Communicator> world) {
      ContextParallel split(world);
      split.set_length(22);
      nn::Gpt model(config);
      model.set_sequence_split(&split);
      const Tensor logits = split.gather(model.forward(split.local_rows(tokens)));
      const std::lock_guard lock(mutex);
      EXPECT_EQ(logits.digest(), expected.digest()) << "cp " << degree;
    });
  }
}

}  // namespace
}  // namespace meshtensor::cp
