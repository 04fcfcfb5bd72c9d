#include <iostream>
#include <memory>
#include <optional>

#include <fmt/format.h>

#include <meshtensor/comm/mpi_backend.hpp>
#include <meshtensor/comm/threads_backend.hpp>
#include <meshtensor/core/error.hpp>
#include <meshtensor/dtensor/check.hpp>
#include <meshtensor/mesh/parse.hpp>
#include <meshtensor/plan/planner.hpp>

#include "commands.hpp"
#include "describe.hpp"

namespace meshtensor::cli {

namespace {
struct CheckOptions;

struct PlanOptions {
  std::string mesh;
  std::string names;
  std::string from;
  std::string to;
  std::string shape;
  std::string dtype = "f32";
  bool no_merge = false;
  bool json = false;
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
  std::uint64_t seed = 0;
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
  command.add_flag("--no-merge", options.no_merge,
                   "at most one mesh dim per collective (no flattened groups)");
}

void print_check(const dtensor::CheckResult& result, const Transition& transition,
                 const CheckOptions& options) {
  if (result.ok) {
    std::cout << "OK " << result.digest << '\n';
  } else {
    std::cout << "MISMATCH " << result.message << '\n';
  }
  std::cout << fmt::format(
      "{} -> {} of {} {} on mesh {} ({} backend, {} mode, seed {}, {} "
      "collective{}{})\n",
      transition.from.to_string(), transition.to.to_string(), transition.shape.to_string(),
      dtype_name(transition.dtype), transition.mesh.to_string(), options.backend, options.mode,
      options.seed, result.collectives, result.collectives == 1 ? "" : "s",
      options.plan.no_merge ? ", no merge" : "");
  if (!result.ok) set_exit_status(1);
}

void run_check_command(const CheckOptions& options) {
  const Transition transition = parse_transition(options.plan);
  dtensor::CheckConfig config;
  static_cast<plan::Redistribution&>(config) = transition;
  config.mode = comm::parse_reduction_mode(options.mode);
  config.seed = options.seed;
  config.merge = !options.plan.no_merge;
  if (options.backend == "threads") {
    if (transition.mesh.size() > 4096) {
      throw InvalidArgument(
          fmt::format("mesh {} has {} ranks; the threads backend runs at most 4096",
                      transition.mesh.to_string(), transition.mesh.size()));
    }
    std::optional<dtensor::CheckResult> result;
    comm::run_threads(static_cast<int>(transition.mesh.size()), [&](comm::Communicator& world) {
      const std::shared_ptr<comm::Communicator> shared(&world, [](comm::Communicator*) {});
      dtensor::CheckResult mine = dtensor::run_check(shared, config);
      if (world.rank() == 0) result = std::move(mine);
    });
    print_check(*result, transition, options);
    return;
  }
  if (options.backend == "mpi") {
    comm::MpiWorld world(nullptr, nullptr);
    const dtensor::CheckResult result = dtensor::run_check(world.communicator(), config);
    if (world.rank() == 0) print_check(result, transition, options);
    if (!result.ok) set_exit_status(1);
    return;
  }
  throw ParseError(fmt::format("unknown --backend '{}': expected threads or mpi", options.backend));
}

void run_plan(const PlanOptions& options) {
  const Transition transition = parse_transition(options);
  plan::PlanOptions plan_options;
  plan_options.merge = !options.no_merge;
  const plan::Plan plan = plan::make_plan(transition.mesh, transition.from, transition.to,
                                          transition.shape, transition.dtype, plan_options);
  if (options.json) {
    nlohmann::json out = plan::to_json(plan);
    out["layouts"] = layouts_json(transition);
    std::cout << out.dump(2) << '\n';
    return;
  }
  std::cout << plan::explain(plan) << '\n' << describe_layouts(transition);
}
}  // namespace

void add_plan_command(CLI::App& app) {
  auto options = std::make_shared<PlanOptions>();
  CLI::App* plan = app.add_subcommand(
      "plan",
      "Explain the steps, groups and bytes of a redistribute between two specs, and "
      "every rank's block under both");
  add_transition_options(*plan, *options);
  plan->add_flag("--json", options->json, "print JSON instead of text");
  plan->callback([options] { run_plan(*options); });
}

void add_check_command(CLI::App& app) {
  auto options = std::make_shared<CheckOptions>();
  CLI::App* check = app.add_subcommand(
      "check", "Run a redistribute on generated data and verify every rank against a reference");
  add_transition_options(*check, options->plan);
  check->add_option("--mode", options->mode, "reduction mode: ordered, exact or native");
  check->add_option("--backend", options->backend, "threads, or mpi under mpirun");
  check->add_option("--seed", options->seed, "seed of the generated contributions");
  check->callback([options] { run_check_command(*options); });
}

}  // namespace meshtensor::cli
