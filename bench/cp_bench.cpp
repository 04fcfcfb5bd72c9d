// `meshtensor bench cp`: context parallelism's balance, communication and memory.
#include "cp_bench.hpp"

#include <algorithm>
#include <cmath>
#include <iostream>
#include <numeric>
#include <variant>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <meshtensor/comm/threads_backend.hpp>
#include <meshtensor/core/error.hpp>
#include <meshtensor/core/random.hpp>
#include <meshtensor/kernels/attention.hpp>
#include <meshtensor/mesh/layout.hpp>
#include <meshtensor/nn/decoder.hpp>
#include <meshtensor/nn/gpt.hpp>
#include <meshtensor/nn/llama.hpp>
#include <meshtensor/train/task.hpp>

#include "timing.hpp"

namespace meshtensor::bench {

namespace {

/// One split's attention over its ranks: the work (key visits, Σ (position + 1) over a rank's
/// rows) and the measured seconds of each rank.
struct BalanceFigures {
  std::int64_t degree = 0;
  ContextSplit split = ContextSplit::head_tail;
  std::vector<double> work;
  std::vector<double> forward;  ///< seconds
  std::vector<double> seconds;  ///< forward and backward
  static double max_over_mean(const std::vector<double>& v) {
    const double mean = std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
    return mean > 0 ? *std::max_element(v.begin(), v.end()) / mean : 0.0;
  }
};

/// One head of a whole sequence: queries, keys (also transposed), values, output gradients.
struct BenchHead {
  std::int64_t length, hd;
  std::vector<float> q, k, k_t, v, v_t, d_out;
  BenchHead(std::int64_t length_, std::int64_t hd_) : length(length_), hd(hd_) {
    const auto n = static_cast<std::size_t>(length * hd);
    for (auto* x : {&q, &k, &k_t, &v, &v_t, &d_out})
      x->resize(n);
    for (std::size_t e = 0; e < n; ++e) {
      q[e] = static_cast<float>(normal_sample(1, e));
      k[e] = static_cast<float>(normal_sample(2, e));
      v[e] = static_cast<float>(normal_sample(3, e));
      d_out[e] = static_cast<float>(normal_sample(4, e));
    }
    for (std::int64_t i = 0; i < length; ++i)
      for (std::int64_t d = 0; d < hd; ++d) {
        k_t[static_cast<std::size_t>(d * length + i)] = k[static_cast<std::size_t>(i * hd + d)];
        v_t[static_cast<std::size_t>(d * length + i)] = v[static_cast<std::size_t>(i * hd + d)];
      }
  }
};

/// Seconds of one rank's attention over the rows `chunks` give it, forward and backward (the
/// kernels a cp rank runs: its rows against every key, then its keys against every row).
std::pair<double, double> rank_attention_seconds(const BenchHead& head,
                                                 const std::vector<Chunk>& chunks) {
  std::vector<std::int64_t> positions;
  for (const Chunk& c : chunks)
    for (std::int64_t t = c.offset; t < c.offset + c.size; ++t)
      positions.push_back(t);
  const auto rows = static_cast<std::int64_t>(positions.size());
  const std::int64_t hd = head.hd;
  std::vector<float> q(static_cast<std::size_t>(rows * hd)), d(q.size()), out(q.size());
  std::vector<kernels::RowStats> stats(static_cast<std::size_t>(rows));
  std::vector<kernels::RowStats> all_stats(static_cast<std::size_t>(head.length), {0.0f, 1.0f});
  std::vector<float> weighted(static_cast<std::size_t>(head.length), 0.0f);
  std::vector<float> p(static_cast<std::size_t>(head.length));
  std::vector<float> dk(q.size()), dv(q.size());
  for (std::int64_t r = 0; r < rows; ++r) {
    std::copy_n(head.q.begin() + positions[static_cast<std::size_t>(r)] * hd, hd,
                q.begin() + r * hd);
    std::copy_n(head.d_out.begin() + positions[static_cast<std::size_t>(r)] * hd, hd,
                d.begin() + r * hd);
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const kernels::HeadCache cache{head.k_t.data(), head.v.data(), head.length, hd};
  const double forward = time_once([&] {
    for (std::int64_t r = 0; r < rows; ++r)
      kernels::attention_row(q.data() + r * hd, cache, positions[static_cast<std::size_t>(r)] + 1,
                             scale, p.data(), out.data() + r * hd,
                             &stats[static_cast<std::size_t>(r)]);
  });
  const double backward = time_once([&] {
    kernels::HeadGradientInputs in;
    in.queries = q.data();
    in.keys = head.k.data();
    in.keys_t = head.k_t.data();
    in.values_t = head.v_t.data();
    in.stats = stats.data();
    in.grad_output = d.data();
    in.length = head.length;
    in.head_dim = hd;
    in.scale = scale;
    std::vector<float> dq(q.size());
    kernels::attention_query_backward(in, positions.data(), rows, dq.data(), weighted.data());
    in.queries = head.q.data();
    in.grad_output = head.d_out.data();
    in.stats = all_stats.data();
    in.weighted = weighted.data();
    std::int64_t row = 0;
    for (const Chunk& c : chunks) {
      kernels::attention_key_backward(in, c.offset, c.size, dk.data() + row * hd,
                                      dv.data() + row * hd);
      row += c.size;
    }
  });
  return {forward, backward};
}

BalanceFigures measure_balance(const BenchHead& head, std::int64_t degree, ContextSplit split,
                               std::int64_t rounds) {
  BalanceFigures f{degree, split, {}, {}, {}};
  for (std::int64_t r = 0; r < degree; ++r) {
    const std::vector<Chunk> chunks = context_chunks(head.length, degree, r, split);
    double work = 0;
    for (const Chunk& c : chunks)
      for (std::int64_t t = c.offset; t < c.offset + c.size; ++t)
        work += static_cast<double>(t + 1);
    f.work.push_back(work);
    std::vector<double> forward;
    std::vector<double> both;
    for (std::int64_t k = 0; k < rounds; ++k) {
      const auto [fwd, bwd] = rank_attention_seconds(head, chunks);
      forward.push_back(fwd);
      both.push_back(fwd + bwd);
    }
    f.forward.push_back(median(forward));
    f.seconds.push_back(median(both));
  }
  return f;
}

/// One training run's figures (rank 0's step time, every rank's activation peak).
struct RunFigures {
  std::string name;
  std::int64_t degree = 1;
  double step_seconds = 0;
  double linked_step_seconds = 0;  ///< the same on the simulated link
  std::vector<std::int64_t> activation_peaks;
  std::uint64_t digest = 0;
  std::int64_t peak() const {
    return *std::max_element(activation_peaks.begin(), activation_peaks.end());
  }
};

void run_once(const train::Task& task, const train::TrainConfig& config, std::int64_t ranks,
              const std::string& link, double& step, RunFigures& figures) {
  train::validate_config(config, task);
  comm::run_threads(
      static_cast<int>(ranks),
      [&](comm::Communicator& world) {
        const train::TrainResult result = train::train(world, task, config);
        if (world.rank() != 0) return;
        step = steady_step_seconds(result.step_seconds);
        figures.activation_peaks = result.activation_peaks;
        figures.digest = result.digest;
      },
      link.empty() ? comm::SimulatedNetwork() : comm::SimulatedNetwork(comm::parse_link(link)));
}

/// cp `degree` (1: one rank) without and with the link, alternated for `rounds` rounds.
RunFigures measure_degree(const train::Task& task, const train::TrainConfig& base,
                          std::int64_t degree, const std::string& link, std::int64_t rounds) {
  train::TrainConfig config = base;
  if (degree > 1) config.mesh = train::parse_named_mesh(std::to_string(degree), "cp");
  RunFigures f;
  f.name = degree > 1 ? fmt::format("cp {}", degree) : "cp 1 (1 rank)";
  f.degree = degree;
  std::vector<double> plain;
  std::vector<double> linked;
  for (std::int64_t r = 0; r < rounds; ++r) {
    double step = 0;
    run_once(task, config, degree, "", step, f);
    plain.push_back(step);
    if (degree > 1) {
      run_once(task, config, degree, link, step, f);
      linked.push_back(step);
    }
  }
  f.step_seconds = median(plain);
  f.linked_step_seconds = degree > 1 ? median(linked) : f.step_seconds;
  return f;
}

std::string mib(std::int64_t bytes) {
  return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / (1 << 20));
}

std::vector<std::string> milliseconds(const std::vector<double>& seconds) {
  std::vector<std::string> out;
  for (const double s : seconds)
    out.push_back(fmt::format("{:.2f}", s * 1e3));
  return out;
}

const char* split_name(ContextSplit split) {
  return split == ContextSplit::head_tail ? "head-tail" : "contiguous";
}

}  // namespace

int run_cp_bench(const ContextBenchConfig& options) {
  print_machine_line(options.input.json);
  const train::Task& task = *options.input.task;
  const auto* language = dynamic_cast<const train::LanguageModelling*>(&task);
  if (language == nullptr)
    throw ParseError("bench cp splits sequences: give --model gpt[:...] or llama[:...]");
  std::unique_ptr<nn::Module> built = task.make_model(0);
  const auto& decoder = dynamic_cast<nn::Decoder&>(*built);
  const std::int64_t length = decoder.context();
  const std::int64_t head_dim = nn::decoder_head_dim(language->model());
  for (const std::int64_t d : options.degrees) {
    if (!context_splits(length, d))
      throw ParseError(fmt::format("--degrees: cp {} does not split the context {}", d, length));
  }
  train::TrainConfig base = options.input.config;
  base.sample = false;
  base.eval_every = 0;
  if (base.steps == 0) base.steps = 4;
  // Balance: the attention kernels on each rank's rows.
  const BenchHead head(length, head_dim);
  std::vector<BalanceFigures> balance;
  for (const std::int64_t d : options.degrees)
    for (const ContextSplit split : {ContextSplit::head_tail, ContextSplit::contiguous})
      balance.push_back(measure_balance(head, d, split, options.rounds));
  // Training: cp 1 and each degree, with and without the link.
  std::vector<RunFigures> runs{measure_degree(task, base, 1, options.link, options.rounds)};
  for (const std::int64_t d : options.degrees)
    runs.push_back(measure_degree(task, base, d, options.link, options.rounds));
  const RunFigures& one = runs.front();
  bool same = true;
  for (const RunFigures& r : runs)
    same = same && r.digest == one.digest;
  nlohmann::json json = {{"model", options.input.model},
                         {"context", length},
                         {"head_dim", head_dim},
                         {"link", options.link},
                         {"mode", comm::reduction_mode_name(base.mode)},
                         {"memory_limit", options.memory_limit}};
  if (!options.input.json) {
    std::cout << fmt::format(
        "model {} (context {}, head dim {}), mode {}, link {}, {} rounds; attention kernels of "
        "one head per rank, forward and backward:\n",
        options.input.model, length, head_dim, comm::reduction_mode_name(base.mode), options.link,
        options.rounds);
  }
  for (const BalanceFigures& f : balance) {
    json["balance"].push_back(
        {{"cp", f.degree},
         {"split", split_name(f.split)},
         {"work", f.work},
         {"forward_seconds", f.forward},
         {"seconds", f.seconds},
         {"forward_time_max_over_mean", BalanceFigures::max_over_mean(f.forward)},
         {"work_max_over_mean", BalanceFigures::max_over_mean(f.work)},
         {"time_max_over_mean", BalanceFigures::max_over_mean(f.seconds)}});
    if (options.input.json) continue;
    std::cout << fmt::format(
        "  cp {} {:<10}  busiest rank / mean: forward work {:.3f}x, forward time {:.3f}x, "
        "forward+backward time {:.3f}x (ms per rank: {})\n",
        f.degree, split_name(f.split), BalanceFigures::max_over_mean(f.work),
        BalanceFigures::max_over_mean(f.forward), BalanceFigures::max_over_mean(f.seconds),
        fmt::join(milliseconds(f.seconds), " "));
  }
  if (!options.input.json) std::cout << "training steps (threads ranks on this machine's cores):\n";
  for (const RunFigures& r : runs) {
    const double ideal = static_cast<double>(one.peak()) / static_cast<double>(r.degree);
    const double memory_ratio = static_cast<double>(r.peak()) / ideal;
    const double link_ratio = r.linked_step_seconds / r.step_seconds;
    const auto longest =
        static_cast<std::int64_t>(static_cast<double>(options.memory_limit) /
                                  (static_cast<double>(r.peak()) / static_cast<double>(length)));
    json["runs"].push_back({{"name", r.name},
                            {"cp", r.degree},
                            {"step_seconds", r.step_seconds},
                            {"linked_step_seconds", r.linked_step_seconds},
                            {"link_over_no_link", link_ratio},
                            {"activation_peaks", r.activation_peaks},
                            {"activation_peak_over_ideal", memory_ratio},
                            {"longest_context_within_limit", longest},
                            {"digest", fmt::format("{:016x}", r.digest)}});
    if (options.input.json) continue;
    std::cout << fmt::format(
        "  {:<14} step {:>8.1f} ms, on the link {:>8.1f} ms ({:.2f}x); activation peak per rank "
        "{} ({:.2f}x cp-1 / cp); longest context within {}: ~{}; digest {:016x}\n",
        r.name, r.step_seconds * 1e3, r.linked_step_seconds * 1e3, link_ratio, mib(r.peak()),
        memory_ratio, mib(options.memory_limit), longest, r.digest);
  }
  json["digests_equal"] = same;
  if (options.input.json) {
    std::cout << json.dump() << "\n";
  } else {
    std::cout << fmt::format(
        "digests {} across cp degrees{}; the longest context extrapolates each run's measured "
        "activation peak, which grows linearly with the context\n",
        same ? "equal" : "differ",
        base.mode == comm::ReductionMode::exact ? ""
                                                : " (ordered mode: each cp degree sums in its own "
                                                  "order; exact mode gives one digest)");
  }
  return !same && base.mode == comm::ReductionMode::exact ? 1 : 0;
}

}  // namespace meshtensor::bench
