#include "redistribute_bench.hpp"

#include <algorithm>
#include <chrono>
#include <functional>

#include <meshtensor/comm/calibrate.hpp>
#include <meshtensor/comm/mesh_groups.hpp>
#include <meshtensor/dtensor/check.hpp>
#include <meshtensor/dtensor/redistribute.hpp>

#include "timing.hpp"

namespace meshtensor::bench {

namespace {
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// The slowest rank's time of one run of `body`, started after a barrier.
double slowest(comm::MeshGroups& groups, const std::function<void()>& body) {
  groups.world().barrier();
  const Clock::time_point start = Clock::now();
  body();
  Tensor elapsed = Tensor::full({1}, DType::f64, seconds_since(start));
  comm::CollectiveOptions max;
  max.op = ReduceOp::max;
  groups.world().all_reduce(elapsed, max);
  return elapsed.values<double>()[0];
}

// Slowest rank's time of one run of `plan`.
double time_once(comm::MeshGroups& groups, const plan::Plan& plan, const Tensor& local,
                 const dtensor::RedistributeOptions& options) {
  return slowest(groups, [&] { dtensor::execute_plan(plan, groups, local, options); });
}

// The cost model's local figures as the runtime measures them (comm::measure_local_costs).
plan::CostModel calibrate_cost_model(comm::MeshGroups& groups) {
  const LocalCosts local = comm::measure_local_costs(groups.world());
  plan::CostModel cost;
  cost.collective_s = local.per_collective_s;
  cost.memory_bandwidth_bytes_s = local.memory_bandwidth_bytes_s;
  return cost;
}
}  // namespace

RedistributeBenchResult time_redistribute(const std::shared_ptr<comm::Communicator>& world,
                                          const RedistributeBenchConfig& config) {
  comm::MeshGroups groups(config.mesh, world);
  const Layout source = local_layout(config.mesh, config.from, config.shape, groups.rank());
  Tensor local(source.local_shape, config.dtype);
  dtensor::fill_contribution(
      local, source, config.shape, 1,
      config.mesh.group_position(groups.rank(), config.from.partial_mesh_dims()));
  const bool topology = !groups.topology().single_level();
  dtensor::RedistributeOptions aware_options;
  aware_options.mode = config.mode;
  RedistributeBenchResult result;
  if (topology) {
    // The cost model's local figures as this machine gives them with every rank running: the
    // plans are chosen on what a step really costs here, links aside.
    const plan::CostModel measured = calibrate_cost_model(groups);
    aware_options.cost = measured;
    result.collective_s = measured.collective_s;
    result.memory_bandwidth_bytes_s = measured.memory_bandwidth_bytes_s;
  }
  dtensor::RedistributeOptions merged_options = aware_options;
  merged_options.topology_aware = false;
  dtensor::RedistributeOptions unmerged_options = merged_options;
  unmerged_options.merge = false;
  const auto plan = [&](const dtensor::RedistributeOptions& options) {
    return dtensor::plan_for(groups, config.from, config.to, config.shape, config.dtype, options);
  };
  const auto merged = plan(merged_options);
  const auto unmerged = plan(unmerged_options);
  const auto aware = plan(aware_options);
  // Warm-up: creates the groups.
  time_once(groups, *merged, local, merged_options);
  time_once(groups, *unmerged, local, unmerged_options);
  if (topology) time_once(groups, *aware, local, aware_options);
  std::vector<double> merged_times, unmerged_times, aware_times;
  for (int i = 0; i < std::max(1, config.iterations); ++i) {
    merged_times.push_back(time_once(groups, *merged, local, merged_options));
    unmerged_times.push_back(time_once(groups, *unmerged, local, unmerged_options));
    if (topology) aware_times.push_back(time_once(groups, *aware, local, aware_options));
  }
  result.merged_s = median(merged_times);
  result.unmerged_s = median(unmerged_times);
  result.ratio = result.merged_s / result.unmerged_s;
  result.merged_collectives = merged->collectives();
  result.unmerged_collectives = unmerged->collectives();
  if (topology) {
    result.topology = true;
    result.aware_s = median(aware_times);
    result.aware_collectives = aware->collectives();
    result.aware_differs = aware->blind_differs;
    for (const plan::Step& step : aware->steps)
      result.aware_two_level_steps += step.two_level ? 1 : 0;
    result.blind_over_aware = result.merged_s / result.aware_s;
    result.one_dim_over_aware = result.unmerged_s / result.aware_s;
  }
  return result;
}

double redistribute_bench_bytes_per_rank(const RedistributeBenchConfig& config) {
  const auto element = static_cast<double>(dtype_size(config.dtype));
  double peak = 0;
  for (const bool merge : {true, false}) {
    plan::PlanOptions options;
    options.merge = merge;
    peak = std::max(peak, static_cast<double>(plan::default_plan_cache()
                                                  .get(config.mesh, config.from, config.to,
                                                       config.shape, config.dtype, options)
                                                  ->peak_bytes_per_rank));
  }
  const double source =
      static_cast<double>(max_local_shape(config.mesh, config.from, config.shape).numel());
  // Exact plans may carry int64 limbs and a key lane per element (up to 24 bytes).
  const double width = config.mode == comm::ReductionMode::exact ? 24.0 / element + 1 : 1.0;
  return source * element + 4.0 * peak * width + (256 << 10);
}

PlanningTime time_planning(const DeviceMesh& mesh, const PlacementSpec& from,
                           const PlacementSpec& to, const Shape& shape, DType dtype,
                           int iterations) {
  // At least `iterations` samples and 0.2 s, but never more than about 2 s in all: a plan that
  // takes long is timed a few times, not hundreds.
  auto time_calls = [&](auto&& call) {
    std::vector<double> times;
    const Clock::time_point begin = Clock::now();
    Clock::time_point start = Clock::now();
    call();
    times.push_back(seconds_since(start));
    // Batches of fast calls, so that the clock's resolution does not matter.
    const int batch = times.front() < 1e-3 ? 16 : 1;
    while ((static_cast<int>(times.size()) < iterations || seconds_since(begin) < 0.2) &&
           seconds_since(begin) < 2.0) {
      start = Clock::now();
      for (int i = 0; i < batch; ++i)
        call();
      times.push_back(seconds_since(start) / batch);
    }
    return median(times);
  };
  PlanningTime result;
  int collectives = 0;
  result.uncached_s = time_calls(
      [&] { collectives = plan::make_plan(mesh, from, to, shape, dtype).collectives(); });
  plan::PlanCache cache;
  cache.get(mesh, from, to, shape, dtype);
  result.cached_s =
      time_calls([&] { collectives = cache.get(mesh, from, to, shape, dtype)->collectives(); });
  result.collectives = collectives;
  return result;
}

}  // namespace meshtensor::bench
