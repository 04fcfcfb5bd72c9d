#include <algorithm>
#include <numeric>

#include <fmt/format.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/plan/plan.hpp>

namespace meshtensor::plan {

std::string_view step_kind_name(StepKind kind) {
  switch (kind) {
    case StepKind::all_reduce:
      return "all_reduce";
    case StepKind::reduce_scatter:
      return "reduce_scatter";
    case StepKind::all_gather:
      return "all_gather";
    case StepKind::all_to_all:
      return "all_to_all";
    case StepKind::local_chunk:
      return "local_chunk";
    case StepKind::local_partial:
      return "local_partial";
    case StepKind::local_pack:
      return "local_pack";
    case StepKind::local_unpack:
      return "local_unpack";
    case StepKind::scale:
      return "scale";
  }
  throw InvalidArgument(fmt::format("unknown step kind {}", static_cast<int>(kind)));
}

bool is_collective(StepKind kind) {
  return kind == StepKind::all_reduce || kind == StepKind::reduce_scatter ||
         kind == StepKind::all_gather || kind == StepKind::all_to_all;
}

int Plan::collectives() const {
  return static_cast<int>(std::count_if(steps.begin(), steps.end(),
                                        [](const Step& step) { return is_collective(step.kind); }));
}

std::int64_t Plan::total_send_bytes() const {
  std::int64_t total = 0;
  for (const Step& step : steps) {
    total = std::accumulate(step.traffic.send_bytes.begin(), step.traffic.send_bytes.end(), total);
  }
  return total;
}

namespace {
std::vector<std::string> group_names(const DeviceMesh& mesh, const std::vector<int>& group) {
  std::vector<std::string> names;
  for (int m : group)
    names.push_back(mesh.dim_name(m));
  return names;
}

std::string human_seconds(double seconds) {
  if (seconds >= 1) return fmt::format("{:.3g} s", seconds);
  if (seconds >= 1e-3) return fmt::format("{:.3g} ms", seconds * 1e3);
  return fmt::format("{:.3g} us", seconds * 1e6);
}

std::string human_bytes(std::int64_t bytes) {
  if (bytes >= (std::int64_t{1} << 30))
    return fmt::format("{:.2f} GiB", static_cast<double>(bytes) / 1073741824.0);
  if (bytes >= (std::int64_t{1} << 20))
    return fmt::format("{:.2f} MiB", static_cast<double>(bytes) / 1048576.0);
  if (bytes >= (std::int64_t{1} << 10))
    return fmt::format("{:.2f} KiB", static_cast<double>(bytes) / 1024.0);
  return fmt::format("{} B", bytes);
}

// Which level a collective's traffic crosses, and the form chosen with both estimates.
std::string level_detail(const Step& step) {
  const std::string where = step.level == LinkLevel::network ? fmt::format("{} hosts", step.units)
                            : step.level == LinkLevel::host  ? fmt::format("{} domains", step.units)
                                                             : std::string("one domain");
  const std::string spread = step.per_unit > 0 ? fmt::format("{} x {} ranks", where, step.per_unit)
                                               : fmt::format("{}, unevenly", where);
  if (step.level == LinkLevel::domain) return "\n       crosses: domain (inside one domain)";
  const std::string unit = step.level == LinkLevel::network ? "host" : "domain";
  if (step.two_level) {
    return fmt::format(
        "\n       crosses: {} ({}); two levels: inside each {}, then across, est {} vs flat {}",
        link_level_name(step.level), spread, unit, human_seconds(step.two_level_cost_s),
        human_seconds(step.flat_cost_s));
  }
  if (step.splits_differ) {
    return fmt::format(
        "\n       crosses: {} ({}); flat (its groups split over {}s differently: ordered sums in "
        "two levels would give their copies different bits)",
        link_level_name(step.level), spread, unit);
  }
  if (step.two_level_cost_s >= 0) {
    return fmt::format("\n       crosses: {} ({}); flat, est {} vs two levels {}",
                       link_level_name(step.level), spread, human_seconds(step.flat_cost_s),
                       human_seconds(step.two_level_cost_s));
  }
  return fmt::format(
      "\n       crosses: {} ({}); flat (two levels need a {} holding 2 or more of its ranks)",
      link_level_name(step.level), spread, unit);
}

std::string step_detail(const Plan& plan, const Step& step) {
  const std::string group =
      step.group.empty() ? std::string("-")
                         : fmt::format("({})", fmt::join(group_names(plan.mesh, step.group), ","));
  switch (step.kind) {
    case StepKind::all_reduce:
    case StepKind::reduce_scatter:
    case StepKind::all_gather:
    case StepKind::all_to_all: {
      std::string text = fmt::format("on {} [{} ranks]", group, step.group_size);
      if (step.kind == StepKind::all_reduce || step.kind == StepKind::reduce_scatter) {
        text += fmt::format(" op {}", reduce_op_name(step.op));
      }
      text +=
          fmt::format(", up to {} out / {} in per rank", human_bytes(step.traffic.max_send_bytes),
                      human_bytes(step.traffic.max_recv_bytes));
      if (step.traffic.uneven) text += ", per-rank counts";
      if (!plan.topology.single_level()) text += level_detail(step);
      return text;
    }
    case StepKind::local_partial:
      return step.keep_dims.empty()
                 ? fmt::format("on {}: each rank keeps its values (zeros around a shard)", group)
                 : fmt::format("on {}: position 0 along ({}) keeps the values, the others zeros",
                               group, fmt::join(group_names(plan.mesh, step.keep_dims), ","));
    case StepKind::scale:
      return fmt::format("divide by {} (the reduced avg dims)", step.divisor);
    case StepKind::local_chunk:
    case StepKind::local_pack:
    case StepKind::local_unpack:
      return fmt::format("for {}", group);
  }
  return {};
}
}  // namespace

std::string explain(const Plan& plan) {
  std::string out =
      fmt::format("redistribute {} -> {} of {} {} on mesh {}{}\n", plan.from.to_string(),
                  plan.to.to_string(), plan.shape.to_string(), dtype_name(plan.dtype),
                  plan.mesh.to_string(), plan.merged ? "" : " (no merge)");
  if (plan.steps.empty()) out += "  nothing to do: both specs lay the tensor out alike\n";
  int index = 0;
  for (const Step& step : plan.steps) {
    out += fmt::format("  {}. {:<15} {} -> {}  {}\n", ++index, step_kind_name(step.kind),
                       step.before.to_string(), step.after.to_string(), step_detail(plan, step));
  }
  out += fmt::format("collectives: {}, bytes sent by all ranks: {}, peak block per rank: {}\n",
                     plan.collectives(), human_bytes(plan.total_send_bytes()),
                     human_bytes(plan.peak_bytes_per_rank));
  if (!plan.topology.single_level()) {
    out += fmt::format("topology: {}\n", plan.topology.to_string());
    if (plan.blind_differs) {
      out += fmt::format(
          "chosen for the topology: est {} against {} for the topology-blind plan ({} "
          "collective{}, all flat) on these links: {:.2f}x\n",
          human_seconds(plan.cost_s), human_seconds(plan.blind_cost_s), plan.blind_collectives,
          plan.blind_collectives == 1 ? "" : "s", plan.blind_cost_s / plan.cost_s);
    } else {
      out +=
          fmt::format("the topology-blind plan is the same (est {})\n", human_seconds(plan.cost_s));
    }
  }
  if (plan.materializes_full_tensor) {
    out += "note: an intermediate step holds the whole tensor on some rank\n";
  }
  if (plan.search_bounded) {
    out +=
        "note: too many intermediate specs to search them all; this plan goes through "
        "Replicate and may not be the cheapest\n";
  }
  return out;
}

nlohmann::json to_json(const Plan& plan) {
  nlohmann::json steps = nlohmann::json::array();
  for (const Step& step : plan.steps) {
    nlohmann::json entry = {{"kind", step_kind_name(step.kind)},
                            {"group", step.group},
                            {"group_names", group_names(plan.mesh, step.group)},
                            {"group_size", step.group_size},
                            {"before", step.before.to_string()},
                            {"after", step.after.to_string()},
                            {"collective", is_collective(step.kind)},
                            {"cost_s", step.cost_s}};
    if (is_collective(step.kind)) {
      entry["level"] = link_level_name(step.level);
      entry["two_level"] = step.two_level;
      entry["units"] = step.units;
      entry["per_unit"] = step.per_unit;
      entry["flat_cost_s"] = step.flat_cost_s;
      if (step.two_level_cost_s >= 0) entry["two_level_cost_s"] = step.two_level_cost_s;
      entry["splits_differ"] = step.splits_differ;
    }
    if (step.kind == StepKind::all_reduce || step.kind == StepKind::reduce_scatter) {
      entry["op"] = reduce_op_name(step.op);
    }
    if (is_collective(step.kind)) {
      entry["bytes_per_rank"] = {{"send", step.traffic.send_bytes},
                                 {"recv", step.traffic.recv_bytes}};
      entry["max_send_bytes"] = step.traffic.max_send_bytes;
      entry["max_recv_bytes"] = step.traffic.max_recv_bytes;
      entry["per_rank_counts"] = step.traffic.uneven;
    }
    if (step.kind == StepKind::local_partial) entry["keep_dims"] = step.keep_dims;
    if (step.kind == StepKind::scale) entry["divisor"] = step.divisor;
    steps.push_back(std::move(entry));
  }
  nlohmann::json topology = {{"hosts", plan.topology.hosts()},
                             {"ranks_per_host", plan.topology.host_sizes_text()},
                             {"description", plan.topology.to_string()}};
  if (!plan.topology.single_level()) {
    topology["blind_cost_s"] = plan.blind_cost_s;
    topology["blind_collectives"] = plan.blind_collectives;
    topology["differs_from_blind"] = plan.blind_differs;
  }
  return {{"topology", std::move(topology)},
          {"mesh", plan.mesh.to_string()},
          {"from", plan.from.to_string()},
          {"to", plan.to.to_string()},
          {"shape", plan.shape.to_string()},
          {"dtype", dtype_name(plan.dtype)},
          {"merged", plan.merged},
          {"collectives", plan.collectives()},
          {"steps", std::move(steps)},
          {"reduced_dims", plan.reduced_dims},
          {"avg_divisor", plan.avg_divisor},
          {"total_send_bytes", plan.total_send_bytes()},
          {"peak_bytes_per_rank", plan.peak_bytes_per_rank},
          {"materializes_full_tensor", plan.materializes_full_tensor},
          {"search_bounded", plan.search_bounded},
          {"cost_s", plan.cost_s}};
}

}  // namespace meshtensor::plan
