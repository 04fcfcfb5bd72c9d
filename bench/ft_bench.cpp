#include "ft_bench.hpp"

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <spawn.h>
#include <sstream>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <meshtensor/core/error.hpp>
#include <meshtensor/ft/coordinator.hpp>

#include "timing.hpp"

extern char** environ;

namespace meshtensor::bench {

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

/// A child process running `binary ARGS...` with its output in a file of its own.
class Child {
 public:
  Child(const std::string& binary, const std::vector<std::string>& args,
        std::filesystem::path output)
      : output_(std::move(output)), started_(now()) {
    std::vector<std::string> all{binary};
    all.insert(all.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (std::string& a : all)
      argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, output_.c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
    const int error = posix_spawn(&pid_, binary.c_str(), &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    if (error != 0) throw Error(fmt::format("cannot start {}: {}", binary, std::strerror(error)));
  }
  ~Child() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  void signal(int number) const { ::kill(pid_, number); }
  /// Waits for the child; its last output line as JSON (the run's result).
  nlohmann::json result() {
    int status = 0;
    ::waitpid(std::exchange(pid_, -1), &status, 0);
    std::ifstream in(output_);
    std::string line, last;
    while (std::getline(in, line))
      if (!line.empty() && line.front() == '{') last = line;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || last.empty()) {
      std::ifstream again(output_);
      std::stringstream text;
      text << again.rdbuf();
      throw Error(fmt::format("a replica group failed (status {}): {}", status, text.str()));
    }
    return nlohmann::json::parse(last);
  }
  double started() const { return started_; }

 private:
  std::filesystem::path output_;
  double started_;
  pid_t pid_ = -1;
};

std::vector<std::string> train_args(const FtBenchConfig& config, std::int64_t steps) {
  return {"train",
          "--model",
          config.model,
          "--mode",
          "exact",
          "--batch",
          fmt::format("{}", config.batch),
          "--steps",
          fmt::format("{}", steps),
          "--ranks",
          "1",
          "--json",
          "--no-sample",
          "--eval-every",
          "100000"};
}

std::vector<std::string> group_args(const FtBenchConfig& config, std::int64_t steps, int groups,
                                    int group, std::uint16_t port) {
  std::vector<std::string> args = train_args(config, steps);
  for (const std::string& a :
       {std::string("--replica-groups"), fmt::format("{}", groups), std::string("--replica-group"),
        fmt::format("{}", group), std::string("--coordinator"), fmt::format("127.0.0.1:{}", port),
        std::string("--replica-timeout"), fmt::format("{}", config.timeout)})
    args.push_back(a);
  return args;
}

std::vector<double> doubles(const nlohmann::json& values) {
  return values.get<std::vector<double>>();
}

/// A run's median step time from its step end times (the steps after the first two).
double median_step(const nlohmann::json& result) {
  const std::vector<double> ends = doubles(result["step_end_times"]);
  std::vector<double> steps;
  for (std::size_t i = 1; i < ends.size(); ++i)
    steps.push_back(ends[i] - ends[i - 1]);
  return steady_median(steps, 1);
}

/// Waits until the coordinator's last quorum is at `step` or later.
void wait_for_step(ft::Coordinator& coordinator, std::int64_t step) {
  const double deadline = now() + 600;
  while (coordinator.last_quorum().step < step) {
    if (now() > deadline) throw Error(fmt::format("the run did not reach step {}", step));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

/// The median step with and without a coordinator (one group), alternated.
void time_quorum_cost(const FtBenchConfig& config, const std::string& binary,
                      const std::filesystem::path& dir, FtBenchResult& result) {
  ft::CoordinatorConfig served{"127.0.0.1", 0, {config.timeout, 1.0}};
  ft::Coordinator coordinator(served);
  coordinator.start();
  std::vector<double> plain, quorum;
  for (int r = 0; r < config.repeats; ++r) {
    Child alone(binary, train_args(config, config.cost_steps), dir / "plain.out");
    plain.push_back(median_step(alone.result()));
    Child group(binary, group_args(config, config.cost_steps, 1, 0, coordinator.port()),
                dir / "quorum.out");
    quorum.push_back(median_step(group.result()));
  }
  result.plain_step_seconds = median(plain);
  result.quorum_step_seconds = median(quorum);
}

/// The first of `ends` after `time`, less `time`.
double next_after(const std::vector<double>& ends, double time) {
  for (const double end : ends)
    if (end > time) return end - time;
  return -1;
}

}  // namespace

FtBenchResult run_ft_bench(const FtBenchConfig& config, const std::string& binary) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / fmt::format("meshtensor-bench-ft-{}", ::getpid());
  std::filesystem::create_directories(dir);
  FtBenchResult result;
  time_quorum_cost(config, binary, dir, result);
  {
    Child whole(binary, train_args(config, config.steps), dir / "whole.out");
    result.uninterrupted_digest = whole.result()["digest"].get<std::string>();
  }
  ft::Coordinator coordinator({"127.0.0.1", 0, {config.timeout, 1.0}});
  coordinator.start();
  const auto start_group = [&](int g, const std::string& name) {
    return std::make_unique<Child>(
        binary, group_args(config, config.steps, config.groups, g, coordinator.port()),
        dir / (name + ".out"));
  };
  std::vector<std::unique_ptr<Child>> groups;
  for (int g = 0; g < config.groups; ++g)
    groups.push_back(start_group(g, fmt::format("group{}", g)));
  std::vector<double> failed_at;
  // A group killed, then restarted; another stopped past the timeout, then killed and restarted.
  const std::int64_t first = config.steps / 4, second = config.steps / 2;
  wait_for_step(coordinator, first);
  failed_at.push_back(now());
  groups[1]->signal(SIGKILL);
  result.failures.push_back({"SIGKILL of group 1", coordinator.last_quorum().step, 0});
  wait_for_step(coordinator, first + 2);
  groups[1] = start_group(1, "group1-restarted");
  const int stopped = config.groups - 1;
  wait_for_step(coordinator, second);
  failed_at.push_back(now());
  groups[stopped]->signal(SIGSTOP);
  result.failures.push_back(
      {fmt::format("SIGSTOP of group {}", stopped), coordinator.last_quorum().step, 0});
  wait_for_step(coordinator, second + 2);
  groups[stopped]->signal(SIGKILL);
  groups[stopped] = start_group(stopped, "group-stopped-restarted");
  std::vector<nlohmann::json> finished;
  for (auto& group : groups)
    finished.push_back(group->result());
  const std::vector<double> ends = doubles(finished[0]["step_end_times"]);
  for (std::size_t f = 0; f < failed_at.size(); ++f)
    result.failures[f].next_step_seconds = next_after(ends, failed_at[f]);
  result.median_step_seconds = median_step(finished[0]);
  for (const int g : {1, stopped}) {
    const nlohmann::json& r = finished[static_cast<std::size_t>(g)];
    const std::vector<double> heal = doubles(r["heal_seconds"]);
    const std::vector<double> group_ends = doubles(r["step_end_times"]);
    result.heals.push_back(
        {g, group_ends.empty() ? -1 : group_ends.front() - groups[g]->started(),
         heal.empty() ? -1 : heal.front(),
         r["healed_steps"].empty() ? -1 : r["healed_steps"][0].get<std::int64_t>()});
  }
  for (const nlohmann::json& r : finished)
    result.digests.push_back(r["digest"].get<std::string>());
  std::filesystem::remove_all(dir);
  return result;
}

}  // namespace meshtensor::bench
