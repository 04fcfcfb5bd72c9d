// Fuzz target for the text parsers, the layout computation and the planner behind
// `meshtensor plan`.
// Input: newline-separated fields: mesh sizes, mesh names, from spec, to spec, shape, dtype.
// Contract checked: every input either parses or throws meshtensor::Error (any other exception
// escapes and is reported as a crash); what parses round-trips through to_string() and gives
// layouts inside the tensor; plans (merged and not) lead from the source blocks to the target
// blocks of every rank.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include <meshtensor/core/error.hpp>
#include <meshtensor/core/shape.hpp>
#include <meshtensor/mesh/layout.hpp>
#include <meshtensor/mesh/parse.hpp>
#include <meshtensor/plan/planner.hpp>

namespace {
void require(bool condition) {
  if (!condition) std::abort();
}

void check_spec_round_trip(const meshtensor::PlacementSpec& spec) {
  require(meshtensor::parse_spec(spec.to_string()) == spec);
}

void exercise(std::string_view input) {
  std::vector<std::string_view> fields = meshtensor::split(input, '\n');
  fields.resize(6);
  try {
    const meshtensor::DeviceMesh mesh = meshtensor::parse_mesh(fields[0], fields[1]);
    require(mesh.size() >= 1 && mesh.ndim() >= 1);
    const meshtensor::PlacementSpec from = meshtensor::parse_spec(fields[2]);
    check_spec_round_trip(from);
    const meshtensor::PlacementSpec to = meshtensor::parse_spec(fields[3]);
    check_spec_round_trip(to);
    const meshtensor::Shape shape = meshtensor::parse_shape(fields[4]);
    require(meshtensor::parse_shape(shape.to_string()) == shape || shape.rank() == 0);
    meshtensor::parse_dtype(fields[5]);
    if (mesh.size() > 4096) return;  // keep each input fast
    for (const auto* spec : {&from, &to}) {
      for (std::int64_t rank = 0; rank < mesh.size(); ++rank) {
        const meshtensor::Layout layout = meshtensor::local_layout(mesh, *spec, shape, rank);
        for (int dim = 0; dim < shape.rank(); ++dim) {
          const std::int64_t begin = layout.global_offset[static_cast<std::size_t>(dim)];
          require(begin >= 0 && begin + layout.local_shape[dim] <= shape[dim]);
        }
      }
    }
    // Planning is bounded for any mesh (large meshes and many changing dims included: that is
    // where a search explodes); only the per-rank checks below grow with the mesh.
    if (mesh.size() > 65536) return;
    for (bool merge : {true, false}) {
      meshtensor::plan::PlanOptions options;
      options.merge = merge;
      const meshtensor::plan::Plan plan =
          meshtensor::plan::make_plan(mesh, from, to, shape, meshtensor::DType::f32, options);
      if (plan.steps.empty()) continue;
      for (std::int64_t rank = 0; rank < mesh.size(); ++rank) {
        require(meshtensor::local_layout(mesh, plan.steps.back().after, shape, rank) ==
                meshtensor::local_layout(mesh, to, shape, rank));
      }
    }
  } catch (const meshtensor::Error&) {
    // Rejected input: the expected outcome for most of what a fuzzer makes.
  }
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  exercise(std::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}
