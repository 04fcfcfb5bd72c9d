#include <chrono>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <meshtensor/checkpoint/checkpoint.hpp>
#include <meshtensor/comm/agree.hpp>
#include <meshtensor/core/digest.hpp>
#include <meshtensor/core/error.hpp>
#include <meshtensor/dtensor/check.hpp>
#include <meshtensor/dtensor/dtensor.hpp>
#include <meshtensor/mesh/layout.hpp>

#include "bindings.hpp"

namespace meshtensor::python {

namespace {

/// SPMD check: every rank of the mesh's world passes the same `text` (what it was asked to do),
/// else every rank raises the same InvalidArgument naming `what` and the first rank that differs.
void check_agreement(const Mesh& mesh, std::string_view what, const std::string& text) {
  const py::gil_scoped_release release;
  comm::check_same_on_every_rank(*mesh.world, what, text);
}

/// The mesh as the agreement checks compare it: its sizes, dim names and world size.
std::string mesh_text(const Mesh& mesh) {
  return fmt::format("mesh {} over a world of {}", mesh.mesh.to_string(), mesh.world->size());
}

dtensor::RedistributeOptions redistribute_options(const std::string& mode, bool merge) {
  dtensor::RedistributeOptions options;
  options.mode = mode_from(mode);
  options.merge = merge;
  return options;
}

// The global shape of blocks every rank holds under `spec`: along each sharded tensor dim the
// sum of the extents of the ranks that tile it. Checks every rank's block against it, so that all
// ranks fail alike. Collective over the mesh's world.
Shape infer_global_shape(Mesh& mesh, const PlacementSpec& spec, const Shape& local) {
  comm::Communicator& world = *mesh.world;
  const int dims = local.rank();
  Tensor mine(Shape{dims + 1}, DType::i64);
  mine.values<std::int64_t>()[0] = dims;
  for (int d = 0; d < dims; ++d)
    mine.values<std::int64_t>()[static_cast<std::size_t>(d + 1)] = local[d];
  Tensor all(Shape{world.size(), dims + 1}, DType::i64);
  world.all_gather(mine, all);
  const auto shapes = all.values<std::int64_t>();
  const auto extent = [&](std::int64_t rank, int d) {
    return shapes[static_cast<std::size_t>(rank * (dims + 1) + d + 1)];
  };
  for (std::int64_t r = 0; r < world.size(); ++r) {
    if (shapes[static_cast<std::size_t>(r * (dims + 1))] != dims) {
      throw InvalidArgument(
          fmt::format("from_local: rank {} holds a {}-d block, rank {} a {}-d one", r,
                      shapes[static_cast<std::size_t>(r * (dims + 1))], world.rank(), dims));
    }
  }
  std::vector<std::int64_t> global(static_cast<std::size_t>(dims));
  for (int d = 0; d < dims; ++d) {
    const std::vector<int> mesh_dims = spec.shard_mesh_dims(d);
    if (mesh_dims.empty()) {
      global[static_cast<std::size_t>(d)] = local[d];
      continue;
    }
    for (const std::int64_t r : mesh.mesh.group_ranks(0, mesh_dims))
      global[static_cast<std::size_t>(d)] += extent(r, d);
  }
  Shape shape(std::move(global));
  for (std::int64_t r = 0; r < world.size(); ++r) {
    const Layout layout = local_layout(mesh.mesh, spec, shape, r);
    for (int d = 0; d < dims; ++d) {
      if (layout.local_shape[d] != extent(r, d)) {
        std::vector<std::int64_t> held;
        for (int e = 0; e < dims; ++e)
          held.push_back(extent(r, e));
        throw InvalidArgument(fmt::format(
            "from_local: rank {} holds a block of shape [{}], but {} of a {} tensor gives it {} "
            "(pass shape= for blocks that are not torch.chunk pieces)",
            r, fmt::join(held, ", "), spec.to_string(), shape.to_string(),
            layout.local_shape.to_string()));
      }
    }
  }
  return shape;
}

PyDTensor from_local(const py::object& local, const std::shared_ptr<Mesh>& mesh,
                     const py::object& placements, const py::object& shape) {
  Tensor block = tensor_from_array(local);
  const auto& groups = mesh->bound("DTensor.from_local");
  const PlacementSpec spec = spec_from(placements, mesh->mesh, block.rank());
  spec.validate(mesh->mesh, block.rank());
  check_agreement(
      *mesh, "DTensor.from_local's mesh, placements, dtype and shape",
      fmt::format("{}, placements {}, {}, shape {}", mesh_text(*mesh), spec.to_string(),
                  dtype_name(block.dtype()),
                  shape.is_none() ? std::string("inferred") : shape_from(shape).to_string()));
  Shape global;
  if (shape.is_none()) {
    const py::gil_scoped_release release;
    global = infer_global_shape(*mesh, spec, block.shape());
  } else {
    global = shape_from(shape);
  }
  return PyDTensor{mesh, dtensor::from_local(std::move(block), groups, spec, global)};
}

std::string save_checkpoint(const py::dict& state, const std::string& root, std::int64_t step,
                            const std::map<std::string, std::string>& metadata, int keep,
                            const py::object& world_object) {
  std::shared_ptr<comm::Communicator> world = world_or_current(world_object);
  std::vector<checkpoint::SaveItem> items;
  std::vector<std::pair<const dtensor::DTensor*, std::string>> dtensors;
  for (const auto& [key, value] : state) {
    auto name = cast_argument<std::string>(key, "save_checkpoint(): a key of state_dict");
    if (py::isinstance<PyDTensor>(value)) {
      dtensors.emplace_back(&value.cast<PyDTensor&>().tensor, std::move(name));
    } else {
      Tensor tensor = tensor_from_array(value);
      items.push_back({std::move(name), tensor.shape(), {}, tensor, world->rank() == 0});
    }
  }
  const py::gil_scoped_release release;  // save_item reduces a Partial tensor (collective)
  for (const auto& [tensor, name] : dtensors)
    items.push_back(checkpoint::save_item(*tensor, name));
  checkpoint::SaveOptions options;
  options.metadata = metadata;
  options.keep = keep;
  return checkpoint::save(*world, root, step, items, options);
}

void load_checkpoint(const py::dict& state, const std::string& path,
                     const py::object& world_object) {
  std::shared_ptr<comm::Communicator> world = world_or_current(world_object);
  std::vector<checkpoint::LoadRequest> requests;
  std::vector<Tensor> targets;
  std::vector<const dtensor::DTensor*> partials;
  std::vector<py::object> copies;  // the arrays loaded into (None for DTensors)
  for (const auto& [key, value] : state) {
    const auto name = cast_argument<std::string>(key, "load_checkpoint(): a key of state_dict");
    if (py::isinstance<PyDTensor>(value)) {
      const dtensor::DTensor& tensor = value.cast<PyDTensor&>().tensor;
      requests.push_back(checkpoint::load_request(name, tensor.groups().mesh(), tensor.spec(),
                                                  tensor.global_shape(), tensor.dtype(),
                                                  tensor.groups().rank()));
      targets.push_back(tensor.local());
      if (!tensor.spec().partial_mesh_dims().empty()) partials.push_back(&tensor);
      copies.emplace_back(py::none());
    } else {
      Tensor tensor = tensor_from_array(value);
      requests.push_back(
          {name, tensor.shape(), tensor.dtype(), {}, tensor.shape(), world->rank() == 0});
      targets.push_back(tensor);
      copies.emplace_back(py::reinterpret_borrow<py::object>(value));
    }
  }
  {
    const py::gil_scoped_release release;
    const std::vector<Tensor> loaded = checkpoint::load(*world, path, requests);
    for (std::size_t i = 0; i < loaded.size(); ++i)
      targets[i].copy_from(loaded[i]);
    for (const dtensor::DTensor* tensor : partials) {
      Tensor local = tensor->local();
      dtensor::keep_partial_sums_on_first(local, tensor->groups().mesh(), tensor->spec(),
                                          tensor->groups().rank());
    }
  }
  for (std::size_t i = 0; i < copies.size(); ++i)
    if (!copies[i].is_none()) write_back(copies[i], targets[i]);
}

}  // namespace

void bind_dtensor(py::module_& module) {
  py::class_<PyDTensor>(
      module, "DTensor",
      "A tensor sharded over a device mesh, seen from one rank: this rank's block plus the "
      "placements and global shape that say where it sits. Operations are collective (SPMD).")
      .def_static("from_local", &from_local, py::arg("local_tensor"), py::arg("device_mesh"),
                  py::arg("placements") = py::none(), py::kw_only(), py::arg("shape") = py::none(),
                  "Wraps the block every rank holds (shared with the array, not copied, when it "
                  "is a C-contiguous writeable array of a meshtensor dtype). Without shape= the "
                  "global shape is worked out from every rank's block (collective) and each block "
                  "is checked.")
      .def(
          "to_local", [](const PyDTensor& d) { return array_from_tensor(d.tensor.local()); },
          "This rank's block, as an array sharing the DTensor's memory.")
      .def(
          "full_tensor",
          [](const PyDTensor& d, const std::string& mode) {
            Tensor full;
            {
              const py::gil_scoped_release release;
              full = d.tensor.full_tensor(redistribute_options(mode, true));
            }
            return array_from_tensor(full);
          },
          py::kw_only(), py::arg("mode") = "ordered",
          "The whole tensor on every rank (Partial dims reduced in `mode`: ordered, exact or "
          "native).")
      .def(
          "redistribute",
          [](const PyDTensor& d, const py::object& device_mesh, const py::object& placements,
             const std::string& mode, bool merge) {
            if (!device_mesh.is_none() && !py::isinstance<Mesh>(device_mesh)) {
              throw ArgumentTypeError(
                  fmt::format("redistribute(): device_mesh must be a DeviceMesh or None, got {}",
                              describe_value(device_mesh)));
            }
            if (!device_mesh.is_none() && device_mesh.ptr() != py::cast(d.mesh).ptr() &&
                !(device_mesh.cast<Mesh&>().mesh == d.mesh->mesh)) {
              throw InvalidArgument(fmt::format(
                  "redistribute moves a tensor within its mesh {}, not onto mesh {}",
                  d.mesh->mesh.to_string(), device_mesh.cast<Mesh&>().mesh.to_string()));
            }
            const PlacementSpec spec =
                spec_from(placements, d.mesh->mesh, d.tensor.global_shape().rank());
            const dtensor::RedistributeOptions options = redistribute_options(mode, merge);
            check_agreement(
                *d.mesh, "redistribute's tensor, placements and mode",
                fmt::format("{} {} {} to {}, mode {}, merge {}", dtype_name(d.tensor.dtype()),
                            d.tensor.global_shape().to_string(), d.tensor.spec().to_string(),
                            spec.to_string(), mode, merge));
            const py::gil_scoped_release release;
            return PyDTensor{d.mesh, d.tensor.redistribute(spec, options)};
          },
          py::arg("device_mesh") = py::none(), py::arg("placements") = py::none(), py::kw_only(),
          py::arg("mode") = "ordered", py::arg("merge") = true,
          "The same tensor under new placements, moved by the planned collectives (merge=False: "
          "at most one mesh dim per collective).")
      .def_property_readonly("placements",
                             [](const PyDTensor& d) { return placements_of(d.tensor.spec()); })
      .def_property_readonly(
          "spec", [](const PyDTensor& d) { return d.tensor.spec().to_string(); },
          "The placements as text, shard order included ('S0@1,S0@0').")
      .def_property_readonly("device_mesh", [](const PyDTensor& d) { return d.mesh; })
      .def_property_readonly(
          "shape", [](const PyDTensor& d) { return as_tuple(d.tensor.global_shape().dims()); })
      .def_property_readonly("ndim",
                             [](const PyDTensor& d) { return d.tensor.global_shape().rank(); })
      .def_property_readonly("dtype",
                             [](const PyDTensor& d) {
                               return array_from_tensor(Tensor(Shape{0}, d.tensor.dtype())).dtype();
                             })
      .def("__repr__", [](const PyDTensor& d) {
        return fmt::format("DTensor(shape={}, dtype={}, placements={}, mesh={}, local_shape={})",
                           d.tensor.global_shape().to_string(), dtype_name(d.tensor.dtype()),
                           d.tensor.spec().to_string(), d.mesh->mesh.to_string(),
                           d.tensor.local().shape().to_string());
      });

  module.def(
      "distribute_tensor",
      [](const py::object& tensor, const std::shared_ptr<Mesh>& mesh,
         const py::object& placements) {
        const Tensor global = tensor_from_array(tensor);
        const auto& groups = mesh->bound("distribute_tensor");
        const PlacementSpec spec = spec_from(placements, mesh->mesh, global.rank());
        Digest64 values;
        if (global.numel() > 0) values.update(std::as_bytes(global.bytes()));
        check_agreement(*mesh, "distribute_tensor's mesh, placements and tensor",
                        fmt::format("{}, placements {}, {} {} with values digest {}",
                                    mesh_text(*mesh), spec.to_string(), dtype_name(global.dtype()),
                                    global.shape().to_string(), digest_hex(values.finish())));
        return PyDTensor{mesh, dtensor::distribute(global, groups, spec)};
      },
      py::arg("tensor"), py::arg("device_mesh"), py::arg("placements") = py::none(),
      "Places `tensor` (the same on every rank, which is checked: InvalidArgument naming the first "
      "rank whose mesh, placements or values differ) on the mesh: each rank keeps a copy of its "
      "block. "
      "Along Partial(sum) dims the member at position 0 keeps the values, the others zeros.");

  module.def(
      "check",
      [](const std::shared_ptr<Mesh>& mesh, const py::object& src, const py::object& dst,
         const py::object& shape, const std::string& dtype, const std::string& mode,
         std::uint64_t seed, bool merge) {
        mesh->bound("check");
        dtensor::CheckConfig config;
        config.mesh = mesh->mesh;
        config.shape = shape_from(shape);
        config.from = spec_from(src, mesh->mesh, config.shape.rank());
        config.to = spec_from(dst, mesh->mesh, config.shape.rank());
        config.dtype = parse_dtype(dtype);
        config.mode = mode_from(mode);
        config.seed = seed;
        config.merge = merge;
        dtensor::CheckResult result;
        {
          const py::gil_scoped_release release;
          result = dtensor::run_check(mesh->world, config);
        }
        py::dict out;
        out["ok"] = result.ok;
        out["digest"] = result.digest;
        out["message"] = result.message;
        out["collectives"] = result.collectives;
        return out;
      },
      py::arg("device_mesh"), py::arg("src"), py::arg("dst"), py::arg("shape"),
      py::arg("dtype") = "f32", py::kw_only(), py::arg("mode") = "ordered", py::arg("seed") = 0,
      py::arg("merge") = true,
      "What `meshtensor check` does, on a mesh bound to a world: redistribute generated "
      "contributions and verify every rank. Returns {'ok', 'digest', 'message', 'collectives'}.");

  module.def(
      "_time_redistribute",
      [](const PyDTensor& d, const py::object& placements, int iterations,
         const std::string& mode) {
        const PlacementSpec spec =
            spec_from(placements, d.mesh->mesh, d.tensor.global_shape().rank());
        const dtensor::RedistributeOptions options = redistribute_options(mode, true);
        const py::gil_scoped_release release;
        const auto start = std::chrono::steady_clock::now();
        for (int i = 0; i < iterations; ++i)
          d.tensor.redistribute(spec, options);
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      },
      py::arg("dtensor"), py::arg("placements"), py::arg("iterations"), py::arg("mode") = "ordered",
      "Seconds `iterations` redistributes of `dtensor` take as C++ calls (the baseline of "
      "bench/python_overhead.py).");

  module.def(
      "contribution",
      [](const py::object& shape, const std::string& dtype, std::uint64_t seed,
         std::int64_t index) {
        const Shape global = shape_from(shape);
        Tensor tensor(global, parse_dtype(dtype));
        const Layout whole{global,
                           std::vector<std::int64_t>(static_cast<std::size_t>(global.rank()), 0)};
        dtensor::fill_contribution(tensor, whole, global, seed, index);
        return array_from_tensor(tensor);
      },
      py::arg("shape"), py::arg("dtype"), py::arg("seed"), py::arg("index"),
      "Contribution `index` of stream `seed`, the data `meshtensor check` reduces.");

  module.def("save_checkpoint", &save_checkpoint, py::arg("state_dict"), py::arg("root"),
             py::arg("step") = 0, py::kw_only(),
             py::arg("metadata") = std::map<std::string, std::string>{}, py::arg("keep") = 0,
             py::arg("world") = py::none(),
             "Saves a dict of DTensors (and arrays, the same on every rank) as the checkpoint "
             "ROOT/step-NNNNNNNN, crash-safely; collective. Returns the directory.");
  module.def("load_checkpoint", &load_checkpoint, py::arg("state_dict"), py::arg("path"),
             py::kw_only(), py::arg("world") = py::none(),
             "Loads a checkpoint (directory, or root with LATEST) into the DTensors and arrays of "
             "a dict, in place, whatever layout saved it; collective. Nothing is written unless "
             "everything loaded and verified.");
}

}  // namespace meshtensor::python
