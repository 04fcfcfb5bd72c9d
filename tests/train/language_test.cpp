#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <meshtensor/comm/mesh_groups.hpp>
#include <meshtensor/comm/threads_backend.hpp>
#include <meshtensor/core/error.hpp>
#include <meshtensor/core/random.hpp>
#include <meshtensor/fsdp/sharded_model.hpp>
#include <meshtensor/nn/loss.hpp>
#include <meshtensor/train/text_data.hpp>
#include <meshtensor/train/trainer.hpp>

#include "support/tiny_gpt.hpp"
#include "support/train_on_threads.hpp"

namespace meshtensor::train {
namespace {

namespace fs = std::filesystem;

/// A fresh directory under the system's temporary directory, removed at the end of the test.
class TempDir {
 public:
  TempDir() {
    path_ = fs::temp_directory_path() /
            fmt::format("meshtensor-text-{}-{}", ::testing::UnitTest::GetInstance()->random_seed(),
                        reinterpret_cast<std::uintptr_t>(this));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string file(const std::string& name, const std::string& content) const {
    const fs::path path = path_ / name;
    std::ofstream(path, std::ios::binary) << content;
    return path.string();
  }
  std::string path() const { return path_.string(); }

 private:
  fs::path path_;
};

TEST(TextData, FortunesSplitEveryTwentiethRecordIntoValidation) {
  std::string text;
  for (int i = 0; i < 45; ++i)
    text += fmt::format("fortune {}\nsecond line\n%\n", i);
  TextCorpus corpus;
  add_text_records(text, corpus);
  EXPECT_EQ(corpus.records, 45);
  EXPECT_EQ(corpus.validation, "fortune 19\nsecond line\n%\nfortune 39\nsecond line\n%\n");
  EXPECT_NE(corpus.train.find("fortune 0\nsecond line\n%\nfortune 1\n"), std::string::npos);
  EXPECT_EQ(corpus.train.find("fortune 19\n"), std::string::npos);
}

TEST(TextData, PlainTextSplitsIntoParagraphs) {
  TextCorpus corpus;
  add_text_records("one\ntwo\n\n\nthree\n  \nfour", corpus);
  EXPECT_EQ(corpus.records, 3);
  EXPECT_EQ(corpus.train, "one\ntwo\n%\nthree\n%\nfour\n%\n");
}

TEST(TextData, FindsTheFirstByteThatIsNotText) {
  EXPECT_EQ(first_non_text_byte("plain \xC3\xA9t\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80"), -1);
  EXPECT_EQ(first_non_text_byte(std::string("ab\0c", 4)), 2);
  EXPECT_EQ(first_non_text_byte("ab\xC3"), 2);            // cut sequence
  EXPECT_EQ(first_non_text_byte("a\xC0\x80"), 1);         // overlong
  EXPECT_EQ(first_non_text_byte("a\xED\xA0\x80"), 1);     // surrogate
  EXPECT_EQ(first_non_text_byte("\xF4\x90\x80\x80"), 0);  // above U+10FFFF
  EXPECT_EQ(printable_text("a\xC3"), "a\xEF\xBF\xBD");
  EXPECT_EQ(printable_text(std::string("\x1b[2J\0\x7f\n\t\xC3\xA9\xFF", 11)),
            "\\x1b[2J\xEF\xBF\xBD\\x7f\n\t\xC3\xA9\xEF\xBF\xBD");
}

TEST(TextData, ReadsADirectorySkippingBinaryFilesAndLinks) {
  const TempDir dir;
  dir.file("b", "second\n%\n");
  dir.file("a", "first\n%\n");
  dir.file("a.dat", std::string("\0\0\1\2", 4));
  dir.file(".hidden", "hidden\n");
  fs::create_symlink(fs::path(dir.path()) / "a", fs::path(dir.path()) / "a.u8");
  const TextCorpus corpus = load_text(dir.path());
  EXPECT_EQ(corpus.files, 2);
  EXPECT_EQ(corpus.skipped, 1);
  EXPECT_EQ(corpus.train, "first\n%\nsecond\n%\n");
}

/// The message of the DataError `load` throws.
std::string error_of(const std::string& path) {
  try {
    load_text(path);
  } catch (const DataError& error) {
    return error.what();
  }
  return "no error";
}

TEST(TextData, ErrorsNameTheFileAndTheProblem) {
  const TempDir dir;
  const std::string missing = dir.path() + "/missing.txt";
  EXPECT_NE(error_of(missing).find(missing + ": no such file"), std::string::npos);
  const std::string empty = dir.file("empty.txt", "");
  EXPECT_NE(error_of(empty).find(empty + ": the text is empty"), std::string::npos);
  const std::string blank = dir.file("blank.txt", "\n  \n%\n");
  EXPECT_NE(error_of(blank).find("empty"), std::string::npos);
  const std::string binary = dir.file("binary.bin", std::string("text\0more", 9));
  EXPECT_NE(error_of(binary).find(binary + ": not UTF-8 text (byte 0 at offset 4"),
            std::string::npos);
  const TempDir only_binary;
  only_binary.file("x.dat", std::string("\xFF\xFE", 2));
  EXPECT_NE(error_of(only_binary.path()).find("holds no UTF-8 text file (1 other file(s))"),
            std::string::npos);
}

/// A tiny GPT on synthetic text: every layer and parameter kind, a few milliseconds a step.
nn::GptConfig tiny_gpt() {
  return testing::tiny_gpt();
}

std::shared_ptr<const TextCorpus> synthetic_text() {
  auto corpus = std::make_shared<TextCorpus>();
  std::string text;
  for (int i = 0; i < 120; ++i) {
    text += fmt::format("line {} says {}{}\n%\n", i, static_cast<char>('a' + i % 26),
                        std::string(static_cast<std::size_t>(i % 7), 'z'));
  }
  add_text_records(text, *corpus);
  return corpus;
}

TEST(LanguageModelling, WindowsDependOnSeedEpochAndPositionOnly) {
  const LanguageModelling task(synthetic_text(), tiny_gpt());
  const Batch whole = task.train_batch(3, 1, 10, 6);
  const Batch tail = task.train_batch(3, 1, 13, 3);
  EXPECT_TRUE(whole.input.narrow(0, 3, 3).contiguous().bitwise_equal(tail.input));
  EXPECT_EQ(std::vector<std::int32_t>(whole.targets.begin() + 24, whole.targets.end()),
            tail.targets);
  EXPECT_FALSE(task.train_batch(3, 2, 10, 6).input.bitwise_equal(whole.input));
  // Targets are the inputs shifted by one token.
  for (std::int64_t t = 0; t + 1 < 8; ++t)
    EXPECT_EQ(whole.targets[static_cast<std::size_t>(t)],
              whole.input.values<std::int64_t>()[static_cast<std::size_t>(t + 1)]);
}

TEST(LanguageModelling, RefusesAContextLongerThanTheText) {
  auto corpus = std::make_shared<TextCorpus>();
  add_text_records("short text\n", *corpus);
  nn::GptConfig model = tiny_gpt();
  model.context = 64;
  try {
    LanguageModelling task(corpus, model);
    FAIL() << "no error";
  } catch (const InvalidArgument& error) {
    EXPECT_NE(std::string(error.what()).find("context=64"), std::string::npos) << error.what();
  }
}

TrainConfig gpt_config(comm::ReductionMode mode) {
  TrainConfig config;
  config.steps = 4;
  config.batch = 7;  // uneven over every rank count below
  config.mode = mode;
  config.schedule.base = 3e-3;
  config.schedule.warmup_steps = 1;
  config.weight_decay = 0.01;
  config.seed = 4;
  config.sample = false;
  return config;
}

TrainResult run_gpt(const TrainConfig& config, int ranks) {
  return testing::train_on_threads(LanguageModelling(synthetic_text(), tiny_gpt()), config, ranks);
}

TEST(LanguageTraining, ExactWeightsAreTheSameBitsOnEveryLayout) {
  const TrainConfig base = gpt_config(comm::ReductionMode::exact);
  const TrainResult reference = run_gpt(base, 1);
  struct Case {
    Strategy strategy;
    int ranks;
    std::int64_t replicas;
    std::int64_t micro;
  };
  for (const Case& c : {Case{Strategy::ddp, 4, 0, 1}, Case{Strategy::fsdp, 8, 0, 1},
                        Case{Strategy::hsdp, 6, 2, 2}, Case{Strategy::fsdp, 1, 0, 3}}) {
    TrainConfig config = base;
    config.strategy = c.strategy;
    config.replicas = c.replicas;
    config.micro_batches = c.micro;
    const TrainResult result = run_gpt(config, c.ranks);
    EXPECT_EQ(result.digest, reference.digest) << result.mesh << ", " << c.micro << " micro";
    EXPECT_TRUE(result.replicas_identical);
    EXPECT_EQ(result.epochs.back().train_loss, reference.epochs.back().train_loss);
    EXPECT_EQ(result.test_loss, reference.test_loss);
  }
}

TEST(LanguageTraining, OrderedReplicasAgreeAndARerunRepeatsThem) {
  TrainConfig config = gpt_config(comm::ReductionMode::ordered);
  config.strategy = Strategy::fsdp;
  const TrainResult first = run_gpt(config, 3);
  EXPECT_TRUE(first.replicas_identical);
  EXPECT_EQ(run_gpt(config, 3).digest, first.digest);
}

TEST(LanguageTraining, LossFallsAndTheSampleIsGenerated) {
  TrainConfig config = gpt_config(comm::ReductionMode::ordered);
  config.steps = 40;
  config.eval_every = 20;
  config.sample = true;
  const TrainResult result = run_gpt(config, 2);
  ASSERT_EQ(result.epochs.size(), 2u);
  EXPECT_LT(result.epochs.back().train_loss, 4.0);  // log(256) = 5.55 at the start
  EXPECT_LT(result.epochs.back().test_loss, result.epochs.front().test_loss + 0.5);
  EXPECT_EQ(static_cast<std::int64_t>(result.sample.size()),
            kSampleTokens + static_cast<std::int64_t>(result.sample.find('\n') + 1));
}

/// Through the sharded runtime, after a training step in either mode: a sequence's logits are the
/// same bits alone and at every position of batches of 1, 3 and 16, on every rank.
TEST(LanguageTraining, ShardedLogitsNeverDependOnTheBatchInEitherMode) {
  for (const auto mode : {comm::ReductionMode::ordered, comm::ReductionMode::exact}) {
    comm::run_threads(2, [&](comm::Communicator& world) {
      nn::Gpt model(tiny_gpt());
      comm::MeshGroups groups(
          DeviceMesh({2}), std::shared_ptr<comm::Communicator>(&world, [](comm::Communicator*) {}));
      fsdp::RuntimeOptions options;
      options.mode = mode;
      fsdp::ShardedModel sharded(model, groups, options);
      fsdp::FsdpConfig config;
      config.shard_mesh_dims = {0};
      for (nn::Module* unit : model.units())
        sharded.fully_shard(*unit, config);
      nn::AdamW optimizer(sharded.optimizer_slots(), 0.0);
      const LanguageModelling task(synthetic_text(), tiny_gpt());
      const Batch step = task.train_batch(1, 0, 4 * world.rank(), 4);
      const Tensor logits = sharded.forward(step.input);
      sharded.backward(nn::softmax_cross_entropy(logits.reshape(Shape{32, 256}), step.targets)
                           .grad_logits.reshape(logits.shape()));
      optimizer.step(1e-2);
      const Tensor sequence = task.train_batch(9, 0, 0, 1).input;
      const Tensor alone = sharded.forward(sequence);
      for (const std::int64_t batch : {1, 3, 16}) {
        for (std::int64_t position = 0; position < batch; ++position) {
          Tensor tokens =
              task.train_batch(10 + static_cast<std::uint64_t>(batch), 0, 0, batch).input;
          tokens.narrow(0, position, 1).copy_from(sequence);
          const Tensor out = sharded.forward(tokens);
          EXPECT_TRUE(out.narrow(0, position, 1).contiguous().bitwise_equal(alone))
              << "mode " << static_cast<int>(mode) << ", batch " << batch << ", position "
              << position;
        }
      }
    });
  }
}

TEST(LanguageTraining, ACheckpointOfFsdpResumesOnHsdpWithTheUninterruptedBits) {
  const TempDir dir;
  TrainConfig config = gpt_config(comm::ReductionMode::exact);
  const TrainResult whole = run_gpt(config, 1);
  TrainConfig first = config;
  first.strategy = Strategy::fsdp;
  first.stop_after = 2;
  first.save_dir = dir.path();
  run_gpt(first, 4);
  TrainConfig second = config;
  second.strategy = Strategy::hsdp;
  second.replicas = 2;
  second.resume_dir = dir.path();
  const TrainResult resumed = run_gpt(second, 4);
  EXPECT_EQ(resumed.resumed_step, 2);
  EXPECT_EQ(resumed.digest, whole.digest);
}

TEST(LanguageModelling, TheMemoryEstimateFollowsWhatARankHolds) {
  // A Llama with a vocabulary large beside its blocks, as the published ones have.
  nn::DecoderSpec llama;
  llama.layers = 2;
  llama.heads = 4;
  llama.kv_heads = 2;
  llama.dim = 64;
  llama.ffn = 128;
  llama.context = 32;
  llama.vocabulary = 256;
  llama.tie = true;
  const LanguageModelling task(synthetic_text(), llama);
  TrainConfig one;
  one.batch = 8;
  const double whole = estimate_rank_bytes(one, task, 1);
  TrainConfig fsdp = one;
  fsdp.strategy = Strategy::fsdp;
  EXPECT_LT(estimate_rank_bytes(fsdp, task, 2), whole);
  // A tp mesh splits the model: each rank holds half of it, and the whole batch.
  TrainConfig tp = one;
  tp.mesh = DeviceMesh({2}, {"tp"});
  const double split = estimate_rank_bytes(tp, task, 2);
  EXPECT_LT(split, whole);
  EXPECT_GT(split, estimate_rank_bytes(fsdp, task, 2) / 2);
  // Micro-batches bound the activations; exact sums cost more; a model whose weights are read
  // next draws none.
  TrainConfig micro = one;
  micro.micro_batches = 4;
  EXPECT_LT(estimate_rank_bytes(micro, task, 1), whole);
  TrainConfig exact = one;
  exact.mode = comm::ReductionMode::exact;
  EXPECT_GT(estimate_rank_bytes(exact, task, 1), whole);
  TrainConfig loaded = one;
  loaded.init_dir = "hf:/nowhere";
  EXPECT_LE(estimate_rank_bytes(loaded, task, 1), whole);
}

}  // namespace
}  // namespace meshtensor::train
