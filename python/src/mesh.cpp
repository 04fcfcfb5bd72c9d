#include <map>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/dtensor/redistribute.hpp>
#include <meshtensor/mesh/layout.hpp>
#include <meshtensor/mesh/parse.hpp>
#include <meshtensor/plan/plan.hpp>

#include "bindings.hpp"

namespace meshtensor::python {

const std::shared_ptr<comm::MeshGroups>& Mesh::bound(const char* what) const {
  if (!groups) {
    throw InvalidArgument(
        fmt::format("{} needs a mesh bound to a world: make it with init_device_mesh inside "
                    "meshtensor.run (mesh {} is only a grid)",
                    what, mesh.to_string()));
  }
  return groups;
}

PlacementSpec spec_from(const py::handle& placements, const DeviceMesh& mesh, int tensor_rank) {
  if (placements.is_none())
    return PlacementSpec(
        std::vector<Placement>(static_cast<std::size_t>(mesh.ndim()), Placement::replicate()));
  std::string text;
  if (py::isinstance<py::str>(placements)) {
    text = placements.cast<std::string>();
  } else if (py::isinstance<py::sequence>(placements)) {
    for (const py::handle item : placements) {
      if (!text.empty()) text += ',';
      if (py::isinstance<py::str>(item)) {
        text += item.cast<std::string>();
        continue;
      }
      // Placement objects carry their token (`_text`), None where it depends on the rank.
      PyObject* token = PyObject_GetAttrString(item.ptr(), "_text");
      if (token == nullptr) {
        PyErr_Clear();
        throw InvalidArgument(
            fmt::format("not a placement: {}", py::repr(item).cast<std::string>()));
      }
      const auto owned = py::reinterpret_steal<py::object>(token);
      text += owned.is_none() ? item.attr("_token")(tensor_rank).cast<std::string>()
                              : owned.cast<std::string>();
    }
  } else {
    throw InvalidArgument(fmt::format("placements must be a sequence or a spec text, got {}",
                                      py::repr(placements).cast<std::string>()));
  }
  // Specs repeat (a training loop, a benchmark): parse each text once per thread.
  thread_local std::map<std::string, PlacementSpec, std::less<>> parsed;
  if (const auto found = parsed.find(text); found != parsed.end()) return found->second;
  PlacementSpec spec = parse_spec(text);
  if (parsed.size() < 256) parsed.emplace(text, spec);
  return spec;
}

py::tuple placements_of(const PlacementSpec& spec) {
  const py::module_ package = py::module_::import("meshtensor");
  py::list list;
  for (const Placement& placement : spec.placements()) {
    if (placement.is_shard()) {
      list.append(package.attr("Shard")(placement.shard_dim()));
    } else if (placement.is_replicate()) {
      list.append(package.attr("Replicate")());
    } else {
      list.append(package.attr("Partial")(std::string(reduce_op_name(placement.reduce_op()))));
    }
  }
  return py::tuple(list);
}

namespace {

DeviceMesh make_mesh(const py::handle& shape, const py::object& names) {
  std::vector<std::string> dim_names;
  if (!names.is_none())
    dim_names = cast_argument<std::vector<std::string>>(names, "mesh_dim_names");
  return DeviceMesh(shape_from(shape).dims(), std::move(dim_names));
}

int mesh_dim_of(const DeviceMesh& mesh, const py::handle& dim) {
  if (py::isinstance<py::str>(dim)) return mesh.dim_index(dim.cast<std::string>());
  const int index = cast_argument<int>(dim, "a mesh dim (a name or an index)");
  if (index < -mesh.ndim() || index >= mesh.ndim())
    throw InvalidArgument(
        fmt::format("mesh dim {} is out of range for mesh {}", index, mesh.to_string()));
  return index < 0 ? index + mesh.ndim() : index;
}

std::vector<int> mesh_dims_of(const DeviceMesh& mesh, const py::handle& dims) {
  std::vector<int> result;
  if (py::isinstance<py::str>(dims) || py::isinstance<py::int_>(dims)) {
    result.push_back(mesh_dim_of(mesh, dims));
  } else {
    for (const py::handle dim : dims)
      result.push_back(mesh_dim_of(mesh, dim));
  }
  return result;
}

}  // namespace

void bind_mesh(py::module_& module) {
  py::class_<Mesh, std::shared_ptr<Mesh>>(
      module, "DeviceMesh",
      "An N-d grid of ranks (rank r at the row-major coordinates of r). DeviceMesh(shape) is the "
      "grid alone, enough for plan(); init_device_mesh() binds one to the calling rank's world for "
      "DTensors and training.")
      .def(py::init([](const py::object& shape, const py::object& names) {
             return std::make_shared<Mesh>(Mesh{make_mesh(shape, names), nullptr, nullptr});
           }),
           py::arg("mesh_shape"), py::arg("mesh_dim_names") = py::none())
      .def_static(
          "parse",
          [](const std::string& sizes, const std::string& names) {
            return std::make_shared<Mesh>(Mesh{parse_mesh(sizes, names), nullptr, nullptr});
          },
          py::arg("sizes"), py::arg("names") = "", "A mesh from text: parse('2x4', 'dp,tp').")
      .def_property_readonly("shape", [](const Mesh& m) { return as_tuple(m.mesh.sizes()); })
      .def_property_readonly("ndim", [](const Mesh& m) { return m.mesh.ndim(); })
      .def_property_readonly("mesh_dim_names",
                             [](const Mesh& m) -> py::object {
                               if (m.mesh.names().empty()) return py::none();
                               return py::tuple(py::cast(m.mesh.names()));
                             })
      .def(
          "size",
          [](const Mesh& m, const py::object& dim) {
            return dim.is_none() ? m.mesh.size() : m.mesh.size(mesh_dim_of(m.mesh, dim));
          },
          py::arg("mesh_dim") = py::none(), "Ranks in the mesh, or along one mesh dim.")
      .def(
          "coordinates",
          [](const Mesh& m, std::int64_t rank) { return as_tuple(m.mesh.coordinates(rank)); },
          py::arg("rank"))
      .def(
          "group_ranks",
          [](const Mesh& m, std::int64_t rank, const py::object& dims) {
            return m.mesh.group_ranks(rank, mesh_dims_of(m.mesh, dims));
          },
          py::arg("rank"), py::arg("mesh_dims"),
          "The ranks sharing every coordinate of `rank` outside `mesh_dims`, major to minor.")
      .def_property_readonly("is_bound", [](const Mesh& m) { return m.groups != nullptr; })
      .def("get_rank", [](const Mesh& m) { return m.bound("get_rank")->rank(); })
      .def("get_coordinate",
           [](const Mesh& m) {
             return as_tuple(m.mesh.coordinates(m.bound("get_coordinate")->rank()));
           })
      .def(
          "get_local_rank",
          [](const Mesh& m, const py::object& dim) {
            const std::vector<int> dims = mesh_dims_of(m.mesh, dim);
            return m.mesh.group_position(m.bound("get_local_rank")->rank(), dims);
          },
          py::arg("mesh_dim"), "This rank's position along a mesh dim.")
      .def(
          "get_group",
          [](const Mesh& m, const py::object& dims) {
            const auto& groups = m.bound("get_group");
            std::vector<int> list;
            if (dims.is_none()) {
              for (int d = 0; d < m.mesh.ndim(); ++d)
                list.push_back(d);
            } else {
              list = mesh_dims_of(m.mesh, dims);
            }
            const py::gil_scoped_release release;  // first use creates the group collectively
            return groups->group(list);
          },
          py::arg("mesh_dim") = py::none(),
          "The communicator along one mesh dim (a name or an index), or a list of them (a "
          "flattened group, major to minor); None: the whole mesh. Collective on first use.")
      .def("__repr__",
           [](const Mesh& m) {
             return fmt::format("DeviceMesh({}{})", m.mesh.to_string(), m.groups ? ", bound" : "");
           })
      .def("__eq__", [](const Mesh& a, const Mesh& b) { return a.mesh == b.mesh; })
      .def("__hash__", [](const Mesh& m) { return py::hash(py::str(m.mesh.to_string())); });

  module.def(
      "init_device_mesh",
      [](const std::string& device_type, const py::object& shape, const py::object& names,
         const py::object& world) {
        if (device_type != "cpu") {
          throw InvalidArgument(fmt::format(
              "meshtensor runs on the CPU: device_type must be 'cpu', got '{}'", device_type));
        }
        DeviceMesh mesh = make_mesh(shape, names);
        std::shared_ptr<comm::Communicator> communicator = world_or_current(world);
        auto groups = std::make_shared<comm::MeshGroups>(mesh, communicator);
        return std::make_shared<Mesh>(
            Mesh{std::move(mesh), std::move(groups), std::move(communicator)});
      },
      py::arg("device_type"), py::arg("mesh_shape"), py::kw_only(),
      py::arg("mesh_dim_names") = py::none(), py::arg("world") = py::none(),
      "A mesh of the calling rank's world (which must have as many ranks), as "
      "torch.distributed.device_mesh.init_device_mesh.");

  module.def(
      "parse_placements", [](const std::string& text) { return placements_of(parse_spec(text)); },
      py::arg("text"), "Placements from the spec text: parse_placements('S0,R,P(avg)').");

  module.def(
      "_plan",
      [](const Mesh& mesh, const py::object& src, const py::object& dst, const py::object& shape,
         const std::string& dtype, const std::string& mode, bool merge) {
        const Shape global = shape_from(shape);
        const PlacementSpec from = spec_from(src, mesh.mesh, global.rank());
        const PlacementSpec to = spec_from(dst, mesh.mesh, global.rank());
        dtensor::RedistributeOptions options;
        options.mode = mode_from(mode);
        options.merge = merge;
        const auto plan =
            dtensor::plan_for(mesh.mesh, from, to, global, parse_dtype(dtype), options);
        return py::make_tuple(plan::to_json(*plan).dump(), plan::explain(*plan));
      },
      py::arg("mesh"), py::arg("src"), py::arg("dst"), py::arg("shape"), py::arg("dtype"),
      py::arg("mode"), py::arg("merge"));

  module.def(
      "local_layout",
      [](const Mesh& mesh, const py::object& placements, const py::object& shape,
         std::int64_t rank) {
        const Shape global = shape_from(shape);
        const Layout layout =
            local_layout(mesh.mesh, spec_from(placements, mesh.mesh, global.rank()), global, rank);
        return py::make_tuple(as_tuple(layout.local_shape.dims()), as_tuple(layout.global_offset));
      },
      py::arg("mesh"), py::arg("placements"), py::arg("shape"), py::arg("rank"),
      "(local shape, global offset) of the block `rank` holds of a tensor of `shape` placed by "
      "`placements` on `mesh` (torch.chunk-style pieces, nested in shard order).");
}

}  // namespace meshtensor::python
