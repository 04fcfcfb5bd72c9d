#pragma once

#include <memory>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <meshtensor/comm/communicator.hpp>
#include <meshtensor/comm/mesh_groups.hpp>
#include <meshtensor/core/error.hpp>
#include <meshtensor/core/tensor.hpp>
#include <meshtensor/dtensor/dtensor.hpp>
#include <meshtensor/mesh/device_mesh.hpp>
#include <meshtensor/mesh/spec.hpp>

/// The pieces of the `_meshtensor` extension, one binder per file; the Python package
/// (python/meshtensor) builds the public API on them.
namespace meshtensor::python {

namespace py = pybind11;

// module.cpp: exceptions and arguments.

/// A Python argument of the wrong type: raised as meshtensor.ArgumentTypeError, which is both a
/// meshtensor.InvalidArgument and a TypeError.
class ArgumentTypeError : public InvalidArgument {
 public:
  using InvalidArgument::InvalidArgument;
};

/// A Python value as a message shows it: its type and its repr, cut to a bounded length.
std::string describe_value(const py::handle& value);

/// `message` (a library error or warning) with each setting it names as `field_name` given as
/// Python names it: the keyword argument field_name (the library names settings by their fields,
/// each front end by its own names).
std::string with_keyword_names(std::string_view message);

/// `json` as Python objects (dicts, lists, str, int, float, bool, None): results keep the
/// library's one JSON schema.
py::object python_of(const nlohmann::json& json);

/// A keyword argument's value as the text a settings table reads (train::TrainSettings): True
/// and False as true and false, a sequence of sizes joined by 'x' ((2, 2) is "2x2"), of names
/// by ',', a float by its shortest round-trip form (the same double), anything else by str().
std::string setting_text(const py::handle& value, std::string_view argument);

/// What a message says an argument of type T must be ("an int", "a sequence of str", ...).
template <class T>
constexpr std::string_view expected_type() {
  if constexpr (std::is_same_v<T, bool>) {
    return "a bool";
  } else if constexpr (std::is_integral_v<T>) {
    return std::is_unsigned_v<T> ? "a non-negative int" : "an int";
  } else if constexpr (std::is_floating_point_v<T>) {
    return "a number";
  } else if constexpr (std::is_same_v<T, std::string>) {
    return "a str";
  } else if constexpr (std::is_same_v<T, std::vector<std::int64_t>>) {
    return "a sequence of ints";
  } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
    return "a sequence of str";
  } else {
    return "of another type";
  }
}

/// `value` as T; ArgumentTypeError "`argument` must be <expected_type<T>()>, got <value>"
/// otherwise (instead of pybind11's message, which names neither).
template <class T>
T cast_argument(const py::handle& value, std::string_view argument) {
  try {
    return value.cast<T>();
  } catch (const py::cast_error&) {
    throw ArgumentTypeError(
        fmt::format("{} must be {}, got {}", argument, expected_type<T>(), describe_value(value)));
  }
}

// arrays.cpp: NumPy <-> Tensor.

/// The dtype of a NumPy array; InvalidArgument naming the NumPy dtype when meshtensor has none.
DType dtype_of_array(const py::array& array);
/// A Tensor over `object`'s memory when it is a C-contiguous, aligned, writeable array of a
/// supported dtype (the Tensor keeps the array alive); otherwise over a contiguous copy. Anything
/// NumPy turns into an array (lists, scalars) is accepted.
Tensor tensor_from_array(const py::handle& object);
/// A NumPy array over the tensor's storage (which the array keeps alive); views and bf16
/// tensors (which NumPy cannot hold) come out as copies, bf16 as float32.
py::array array_from_tensor(const Tensor& tensor);
/// A Shape from a sequence of ints (or one int); InvalidArgument naming the value otherwise.
Shape shape_from(const py::handle& object);
/// What a call that wrote `tensor` in place of `original` returns: the original array, with the
/// result copied into it unless `tensor` is its own memory; for anything else, a new array.
py::object write_back(const py::object& original, const Tensor& tensor);
/// Dims, coordinates or offsets as a Python tuple.
py::tuple as_tuple(const std::vector<std::int64_t>& values);

// runtime.cpp: worlds, communicators, the rank a thread runs.

/// The world communicator of the calling rank: the one run_threads gave this thread, else the
/// mpi world of this process; InvalidArgument when there is none.
std::shared_ptr<comm::Communicator> current_world();
/// `world` when not None, else current_world().
std::shared_ptr<comm::Communicator> world_or_current(const py::object& world);
/// Parses "ordered" / "exact" / "native".
comm::ReductionMode mode_from(const std::string& text);

// mesh.cpp: meshes and placements.

/// A device mesh as Python sees it: the pure grid, plus its groups on this rank when the mesh
/// was made for a world (init_device_mesh).
struct Mesh {
  DeviceMesh mesh;
  std::shared_ptr<comm::MeshGroups> groups;   ///< null for a mesh that is only a grid
  std::shared_ptr<comm::Communicator> world;  ///< the world of `groups` (null with them)
  /// The groups; InvalidArgument naming `what` when the mesh is not bound to a world.
  const std::shared_ptr<comm::MeshGroups>& bound(const char* what) const;
};
/// A PlacementSpec from placements as Python gives them: a spec text ("S0,R"), a sequence of
/// Placement objects and/or tokens, or None (Replicate everywhere). Negative shard dims count
/// from the end of a tensor of `tensor_rank` dims.
PlacementSpec spec_from(const py::handle& placements, const DeviceMesh& mesh, int tensor_rank);
/// The Python placement objects (meshtensor.Shard, ...) of `spec`, as a tuple.
py::tuple placements_of(const PlacementSpec& spec);

/// A DTensor with the Python mesh it lives on.
struct PyDTensor {
  std::shared_ptr<Mesh> mesh;
  dtensor::DTensor tensor;
};

void bind_arrays(py::module_& module);
void bind_runtime(py::module_& module);
void bind_mesh(py::module_& module);
void bind_dtensor(py::module_& module);
void bind_ops(py::module_& module);
void bind_generate(py::module_& module);
void bind_train(py::module_& module);
void bind_rl(py::module_& module);

}  // namespace meshtensor::python
