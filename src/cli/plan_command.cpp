#include <iostream>
#include <memory>

#include <meshtensor/core/error.hpp>
#include <meshtensor/mesh/parse.hpp>

#include "commands.hpp"
#include "describe.hpp"

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
};

Transition parse_transition(const PlanOptions& options) {
  Transition transition{parse_mesh(options.mesh, options.names), parse_spec(options.from),
                        parse_spec(options.to), parse_shape(options.shape),
                        parse_dtype(options.dtype)};
  transition.from.validate(transition.mesh, transition.shape.rank());
  transition.to.validate(transition.mesh, transition.shape.rank());
  return transition;
}

void run_plan(const PlanOptions& options) {
  const Transition transition = parse_transition(options);
  if (options.json) {
    nlohmann::json out = layouts_json(transition);
    out["merge"] = !options.no_merge;
    std::cout << out.dump(2) << '\n';
    return;
  }
  std::cout << describe_layouts(transition);
}
}  // namespace

void add_plan_command(CLI::App& app) {
  auto options = std::make_shared<PlanOptions>();
  CLI::App* plan = app.add_subcommand(
      "plan",
      "Show how a redistribute between two placement specs lays the tensor out on every rank");
  plan->add_option("--mesh", options->mesh, "mesh sizes, e.g. 2x2x2")->required();
  plan->add_option("--names", options->names, "mesh dim names, e.g. dp,fsdp,tp");
  plan->add_option("--from", options->from,
                   "source placements, e.g. P,R,P; S0@1,S0@0 sets the shard order")
      ->required();
  plan->add_option("--to", options->to, "target placements, e.g. R,R,R")->required();
  plan->add_option("--shape", options->shape, "global tensor shape, e.g. 16x16x16")->required();
  plan->add_option("--dtype", options->dtype, "element type: f64 f32 bf16 f16 i64 i32 u8");
  plan->add_flag("--no-merge", options->no_merge, "keep one collective per mesh dim");
  plan->add_flag("--json", options->json, "print JSON instead of text");
  plan->callback([options] { run_plan(*options); });
}

}  // namespace meshtensor::cli
