#include "rl_bench.hpp"

#include <memory>
#include <mutex>

#include <meshtensor/comm/threads_backend.hpp>
#include <meshtensor/core/random.hpp>
#include <meshtensor/generate/generator.hpp>
#include <meshtensor/generate/load.hpp>
#include <meshtensor/rl/grpo.hpp>
#include <meshtensor/tp/style.hpp>
#include <meshtensor/train/training_model.hpp>

#include "timing.hpp"

namespace meshtensor::bench {

namespace {

/// A trainer layout and a generator layout on the same ranks.
struct LayoutPair {
  std::string trainer_mesh;  // "4" with names "fsdp", ...
  std::string trainer_names;
  bool sequence_parallel = false;
  rl::GeneratorLayout generator;
};

std::vector<LayoutPair> layout_pairs(int ranks) {
  const std::string all = std::to_string(ranks);
  const std::string half = std::to_string(ranks / 2);
  std::vector<LayoutPair> pairs{{all, "fsdp", false, {ranks / 2, 2}},
                                {all, "fsdp", false, {ranks, 1}},
                                {half + "x2", "fsdp,tp", true, {ranks / 2, 2}},
                                {half + "x2", "fsdp,tp", true, {ranks, 1}}};
  if (ranks % 4 == 0) pairs.push_back({half + "x2", "fsdp,tp", true, {ranks / 4, 4}});
  return pairs;
}

/// Seconds of `fn` on this rank between two barriers.
template <class Fn>
double timed(comm::Communicator& world, Fn&& fn) {
  world.barrier();
  return time_once([&] {
    fn();
    world.barrier();
  });
}

SyncComparison compare_sync(const RlBenchConfig& config, const LayoutPair& pair,
                            const train::Task& task) {
  SyncComparison result;
  std::mutex mutex;
  comm::run_threads(
      config.ranks,
      [&](comm::Communicator& world) {
        train::TrainConfig trainer_config;
        trainer_config.mesh = train::parse_named_mesh(pair.trainer_mesh, pair.trainer_names);
        trainer_config.sequence_parallel = pair.sequence_parallel;
        train::TrainingModel trainer(world, task, trainer_config, 1, false);
        comm::MeshGroups generator_groups(
            pair.generator.mesh(),
            std::shared_ptr<comm::Communicator>(&world, [](comm::Communicator*) {}));
        const std::unique_ptr<nn::Decoder> generator = nn::make_decoder(config.model);
        tp::TensorParallel tp(generator_groups.group(std::vector<int>{1}),
                              comm::ReductionMode::ordered, false);
        generate::parallelize_for_generation(*generator, tp);
        rl::WeightSync sync(trainer, 1, generator_groups, generator->parameters(),
                            comm::ReductionMode::ordered);
        rl::SyncStats planner;
        rl::SyncStats naive;
        // Alternated, so that a change in the host's load lands on both.
        std::vector<double> planner_times;
        std::vector<double> naive_times;
        for (int r = 0; r < config.repeats; ++r) {
          planner_times.push_back(timed(world, [&] { planner = sync.run(); }));
          naive_times.push_back(timed(world, [&] {
            naive = rl::naive_weight_sync(trainer, pair.generator.mesh(), generator->parameters());
          }));
        }
        const double planner_s = median(planner_times);
        const double naive_s = median(naive_times);
        if (world.rank() != 0) return;
        const std::lock_guard lock(mutex);
        result = {trainer.layout().description,
                  pair.generator.describe(),
                  planner_s,
                  naive_s,
                  planner.collectives,
                  planner.bytes_per_rank,
                  naive.collectives,
                  naive.bytes_per_rank};
      },
      comm::parse_link(config.link));
  return result;
}

StepShare step_share(const RlBenchConfig& config, const rl::RlTask& task,
                     const std::string& setting, const rl::RlConfig& rl_config, int ranks,
                     const std::string& link) {
  std::vector<rl::RlStepReport> reports;
  std::mutex mutex;
  comm::run_threads(
      ranks,
      [&](comm::Communicator& world) {
        const rl::RlResult result = rl::run_rl(world, task, rl_config);
        if (world.rank() != 0) return;
        const std::lock_guard lock(mutex);
        reports = result.steps;
      },
      link.empty() ? comm::LinkDelay() : comm::parse_link(link));
  std::vector<double> step;
  std::vector<double> sync;
  std::vector<double> generate;
  std::vector<double> train;
  for (std::size_t s = reports.size() > 1 ? 1 : 0; s < reports.size(); ++s) {
    const rl::RlStepReport& r = reports[s];
    step.push_back(r.sync_seconds + r.generate_seconds + r.train_seconds);
    sync.push_back(r.sync_seconds);
    generate.push_back(r.generate_seconds);
    train.push_back(r.train_seconds);
  }
  (void)config;
  return {setting, median(step), median(sync), median(generate), median(train)};
}

/// The default `meshtensor rl` setting on `model`.
rl::RlConfig default_setting(const RlBenchConfig& config) {
  rl::RlConfig rl_config;
  rl_config.model = config.model;
  rl_config.steps = config.steps;
  rl_config.kl = 0.05;
  rl_config.train.mode = comm::ReductionMode::exact;
  rl_config.train.schedule.base = 3e-4;
  rl_config.train.clip_grad_norm = 1.0;
  return rl_config;
}

/// Tokens per second of a Generator alone on the requests of one RL step (same count, lengths
/// and batch), on a fresh model.
double generator_alone(const RlBenchConfig& config, const rl::RlTask& task,
                       const rl::RlConfig& rl_config, int repeats) {
  const std::unique_ptr<nn::Decoder> decoder = nn::make_decoder(config.model);
  nn::Decoder& model = *decoder;
  model.set_exact_sums(true);
  generate::GeneratorOptions options;
  options.max_batch = rl_config.max_batch;
  options.prefill_chunk = rl_config.prefill_chunk;
  options.exact_logprobs = true;
  generate::Generator generator(model, options);
  std::vector<generate::Request> requests;
  for (std::int64_t q = 0; q < rl_config.prompts * rl_config.samples; ++q) {
    const std::string& prompt =
        task.prompts[static_cast<std::size_t>(q / rl_config.samples) % task.prompts.size()];
    requests.push_back({generate::byte_tokens(prompt),
                        rl_config.new_tokens,
                        {rl_config.temperature, 0, mix64(static_cast<std::uint64_t>(q))}});
  }
  std::vector<double> seconds;
  for (int r = 0; r < repeats; ++r)
    seconds.push_back(time_once([&] { generator.generate(requests); }));
  return static_cast<double>(requests.size() * static_cast<std::size_t>(rl_config.new_tokens)) /
         median(seconds);
}

/// Whether a model of `model` splits over `degree` tensor-parallel ranks.
bool splits_over(const nn::DecoderSpec& model, std::int64_t degree) {
  try {
    tp::check_decoder_degree(model, degree);
    return true;
  } catch (const InvalidArgument&) {
    return false;
  }
}

}  // namespace

RlBenchResult run_rl_bench(const RlBenchConfig& config) {
  RlBenchResult result;
  const rl::RlTask words =
      rl::builtin_task("words", train::kDefaultTextDir, rl::kDefaultDictionary, 16);
  const train::LanguageModelling task(words.corpus, config.model);
  for (const LayoutPair& pair : layout_pairs(config.ranks)) {
    if (!splits_over(config.model, pair.generator.tp)) continue;
    result.syncs.push_back(compare_sync(config, pair, task));
  }
  const rl::RlConfig one = default_setting(config);
  result.steps.push_back(step_share(config, words, "default: 1 rank, generator 1x1", one, 1, ""));
  rl::RlConfig spread = default_setting(config);
  spread.train.mesh = train::parse_named_mesh(std::to_string(config.ranks), "fsdp");
  spread.generator = {config.ranks / 2, 2};
  result.steps.push_back(step_share(config, words,
                                    "fsdp " + std::to_string(config.ranks) + ", generator " +
                                        spread.generator.describe() + ", link " + config.link,
                                    spread, config.ranks, config.link));
  // Rollouts: the generation of the 1-rank steps against the generator alone, same batch.
  std::vector<rl::RlStepReport> reports;
  {
    std::mutex mutex;
    comm::run_threads(1, [&](comm::Communicator& world) {
      const rl::RlResult run = rl::run_rl(world, words, one);
      const std::lock_guard lock(mutex);
      reports = run.steps;
    });
  }
  std::vector<double> rates;
  for (std::size_t s = 1; s < reports.size(); ++s)
    rates.push_back(static_cast<double>(one.prompts * one.samples * one.new_tokens) /
                    reports[s].generate_seconds);
  result.rollout_batch = std::min(one.prompts * one.samples, one.max_batch);
  result.rollout_tokens_per_second = median(rates);
  result.generator_tokens_per_second = generator_alone(config, words, one, config.repeats);
  return result;
}

}  // namespace meshtensor::bench
