#include <cstdlib>
#include <iostream>
#include <memory>
#include <optional>

#include <fmt/format.h>

#include <meshtensor/comm/mesh_groups.hpp>
#include <meshtensor/comm/threads_backend.hpp>
#include <meshtensor/core/error.hpp>
#include <meshtensor/core/memory.hpp>
#include <meshtensor/dtensor/check.hpp>
#include <meshtensor/dtensor/redistribute.hpp>
#include <meshtensor/mesh/parse.hpp>
#include <meshtensor/plan/planner.hpp>

#include "backend.hpp"
#include "commands.hpp"
#include "describe.hpp"
#include "options.hpp"

namespace meshtensor::cli {

namespace {
struct PlanOptions {
  std::string mesh;
  std::string names;
  std::string from;
  std::string to;
  std::string shape;
  std::string dtype = "f32";
  bool no_merge = false;
  bool json = false;
  bool all_ranks = false;
  std::string mode = "ordered";  // plan only; check keeps its own
  TopologyOptions topology;
};

Transition parse_transition(const PlanOptions& options) {
  Transition transition{parse_mesh(options.mesh, options.names), parse_spec(options.from),
                        parse_spec(options.to), parse_shape(options.shape),
                        parse_dtype(options.dtype)};
  transition.from.validate(transition.mesh, transition.shape.rank());
  transition.to.validate(transition.mesh, transition.shape.rank());
  return transition;
}

struct CheckOptions {
  PlanOptions plan;
  std::string mode = "ordered";
  std::string backend = "threads";
  std::string seed = "0";
  TimeoutOption timeout;
};

void add_transition_options(CLI::App& command, PlanOptions& options) {
  command.add_option("--mesh", options.mesh, "mesh sizes, e.g. 2x2x2")->required();
  command.add_option("--names", options.names, "mesh dim names, e.g. dp,fsdp,tp");
  command
      .add_option("--from", options.from,
                  "source placements, e.g. P,R,P; S0@1,S0@0 sets the shard order")
      ->required();
  command.add_option("--to", options.to, "target placements, e.g. R,R,R")->required();
  command.add_option("--shape", options.shape, "global tensor shape, e.g. 16x16x16")->required();
  command.add_option("--dtype", options.dtype, "element type: f64 f32 bf16 f16 i64 i32 u8");
  add_flag(command, "--no-merge", options.no_merge,
           "at most one mesh dim per collective (no flattened groups)");
  options.topology.add_to(command);
}

void print_check(const dtensor::CheckResult& result, const dtensor::CheckConfig& config,
                 const CheckOptions& options) {
  if (result.ok) {
    std::cout << "OK " << result.digest << '\n';
  } else {
    std::cout << "MISMATCH " << result.message << '\n';
  }
  std::cout << fmt::format(
      "{} -> {} of {} {} on mesh {} ({} backend, {} mode, seed {}, {} "
      "collective{}{}{})\n",
      config.from.to_string(), config.to.to_string(), config.shape.to_string(),
      dtype_name(config.dtype), config.mesh.to_string(), options.backend, options.mode, config.seed,
      result.collectives, result.collectives == 1 ? "" : "s",
      result.two_level > 0 ? fmt::format(", {} in two levels", result.two_level) : "",
      config.merge ? "" : ", no merge");
  std::cout.flush();
}

// Ranks of an mpirun job on this machine (OpenMPI tells each process); 1 when unknown.
std::int64_t ranks_on_this_machine() {
  const char* text = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  if (text == nullptr) return 1;
  const long long value = std::atoll(text);
  return value > 0 ? value : 1;
}

void run_check_command(const CheckOptions& options) {
  dtensor::CheckConfig config;
  static_cast<plan::Redistribution&>(config) = parse_transition(options.plan);
  config.mode = comm::parse_reduction_mode(options.mode);
  config.seed = seed_setting("--seed", options.seed);
  config.merge = !options.plan.no_merge;
  const Backend backend = parse_backend(options.backend);
  options.plan.topology.check_backend(backend == Backend::mpi);
  const comm::SimulatedNetwork network = options.plan.topology.network(config.mesh.size());
  options.timeout.apply();
  if (backend == Backend::threads && config.mesh.size() > comm::kMaxThreadsRanks) {
    throw InvalidArgument(fmt::format("mesh {} has {} ranks; the threads backend runs at most {}",
                                      config.mesh.to_string(), config.mesh.size(),
                                      comm::kMaxThreadsRanks));
  }
  // Planning first (it is quick, or refuses quickly), then the memory the ranks on this
  // machine will hold, before anything is allocated.
  dtensor::RedistributeOptions redistribute;
  redistribute.mode = config.mode;
  redistribute.merge = config.merge;
  const auto plan = dtensor::plan_for(config.mesh, config.from, config.to, config.shape,
                                      config.dtype, redistribute);
  const std::int64_t local_ranks =
      backend == Backend::threads ? config.mesh.size() : ranks_on_this_machine();
  require_memory(
      dtensor::check_bytes(config, *plan, local_ranks),
      fmt::format("check of {} {} on mesh {} ({} ranks on this machine)", config.shape.to_string(),
                  dtype_name(config.dtype), config.mesh.to_string(), local_ranks));
  const std::string command = fmt::format(
      "check mesh={} names={} from={} to={} shape={} dtype={} merge={} mode={} seed={}",
      config.mesh.to_string(), options.plan.names, config.from.to_string(), config.to.to_string(),
      config.shape.to_string(), dtype_name(config.dtype), config.merge, options.mode, config.seed);
  std::string where;
  std::optional<dtensor::CheckResult> result;
  run_ranks(
      backend, config.mesh.size(), command,
      [&](comm::Communicator& world) {
        const std::shared_ptr<comm::Communicator> shared(&world, [](comm::Communicator*) {});
        if (world.rank() == 0 && world.topology()) where = world.topology()->to_string();
        dtensor::CheckResult mine = dtensor::run_check(shared, config);
        if (world.rank() == 0) {
          if (backend == Backend::mpi) print_check(mine, config, options);
          result = std::move(mine);
        }
      },
      network);
  // On mpi only rank 0 holds the result; the job's status is the worst of its processes'.
  if (result) {
    if (backend == Backend::threads) print_check(*result, config, options);
    if (!where.empty()) std::cout << "topology: " << where << '\n';
    if (!result->ok) set_exit_status(1);
  }
}

void run_plan(const PlanOptions& options) {
  const Transition transition = parse_transition(options);
  dtensor::RedistributeOptions redistribute;
  redistribute.mode = comm::parse_reduction_mode(options.mode);
  redistribute.merge = !options.no_merge;
  plan::PlanOptions plan_options = dtensor::plan_options(
      redistribute, options.topology.topology(transition.mesh.size()), transition.dtype);
  const plan::Plan plan = plan::make_plan(transition.mesh, transition.from, transition.to,
                                          transition.shape, transition.dtype, plan_options);
  if (options.json) {
    nlohmann::json out = plan::to_json(plan);
    out["layouts"] = layouts_json(transition, options.all_ranks);
    std::cout << out.dump(2) << '\n';
    return;
  }
  std::cout << plan::explain(plan) << '\n' << describe_layouts(transition, options.all_ranks);
}
}  // namespace

void add_plan_command(CLI::App& app) {
  auto options = std::make_shared<PlanOptions>();
  CLI::App* plan = app.add_subcommand(
      "plan",
      "Explain the steps, groups and bytes of a redistribute between two specs, and "
      "every rank's block under both");
  add_transition_options(*plan, *options);
  add_flag(*plan, "--json", options->json, "print JSON instead of text");
  plan->add_option("--mode", options->mode,
                   "reduction mode the plan is for: ordered (default; ordered sums run in two "
                   "levels only where every group splits over hosts alike), exact or native");
  add_flag(*plan, "--all-ranks", options->all_ranks,
           "list every rank's block (by default the first 4096 of a larger mesh)");
  plan->callback([options] { run_plan(*options); });
}

void add_check_command(CLI::App& app) {
  auto options = std::make_shared<CheckOptions>();
  CLI::App* check = app.add_subcommand(
      "check", "Run a redistribute on generated data and verify every rank against a reference");
  add_transition_options(*check, options->plan);
  check->add_option("--mode", options->mode, "reduction mode: ordered, exact or native");
  check->add_option("--backend", options->backend, "threads, or mpi under mpirun");
  check->add_option("--seed", options->seed, "seed of the generated contributions (default 0)");
  options->timeout.add_to(*check);
  check->callback([options] { run_check_command(*options); });
}

}  // namespace meshtensor::cli
