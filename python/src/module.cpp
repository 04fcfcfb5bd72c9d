#include <meshtensor/core/error.hpp>

#include "bindings.hpp"

namespace meshtensor::python {
namespace {

// Python classes of the C++ exceptions, with the same names and hierarchy; ParseError and
// InvalidArgument are ValueErrors too, and TimeoutError is Python's TimeoutError too.
struct ExceptionClasses {
  PyObject* error = nullptr;
  PyObject* parse = nullptr;
  PyObject* invalid = nullptr;
  PyObject* resource = nullptr;
  PyObject* data = nullptr;
  PyObject* comm = nullptr;
  PyObject* timeout = nullptr;
  PyObject* desync = nullptr;
  PyObject* argument_type = nullptr;
};
ExceptionClasses g_exceptions;

PyObject* add_exception(py::module_& module, const char* name, py::tuple bases, const char* doc) {
  const std::string qualified = std::string("meshtensor.") + name;
  PyObject* type = PyErr_NewExceptionWithDoc(qualified.c_str(), doc, bases.ptr(), nullptr);
  if (type == nullptr) throw py::error_already_set();
  module.add_object(name, py::reinterpret_borrow<py::object>(type));
  return type;
}

void bind_exceptions(py::module_& module) {
  const py::handle runtime_error(PyExc_RuntimeError);
  const py::handle value_error(PyExc_ValueError);
  const py::handle timeout_error(PyExc_TimeoutError);
  auto& e = g_exceptions;
  e.error = add_exception(module, "Error", py::make_tuple(runtime_error),
                          "Root of every exception meshtensor raises.");
  const py::handle base(e.error);
  e.parse = add_exception(module, "ParseError", py::make_tuple(base, value_error),
                          "Text that does not parse (mesh, shape, placement, dtype, ...).");
  e.invalid = add_exception(module, "InvalidArgument", py::make_tuple(base, value_error),
                            "A well-formed value that is not valid here.");
  e.resource = add_exception(module, "ResourceError", py::make_tuple(base),
                             "More memory, threads or ranks than the machine has.");
  e.data = add_exception(module, "DataError", py::make_tuple(base),
                         "A missing, truncated or malformed file.");
  e.comm = add_exception(module, "CommError", py::make_tuple(base), "A collective failed.");
  e.argument_type = add_exception(
      module, "ArgumentTypeError",
      py::make_tuple(py::handle(e.invalid), py::handle(PyExc_TypeError)),
      "An argument of the wrong type; the message names the argument. Both an InvalidArgument "
      "and a TypeError.");
  const py::handle comm_error(e.comm);
  e.timeout = add_exception(module, "TimeoutError", py::make_tuple(comm_error, timeout_error),
                            "A collective did not complete within its timeout.");
  e.desync = add_exception(module, "DesyncError", py::make_tuple(comm_error),
                           "Ranks issued different collectives at one position of a group.");
  py::register_exception_translator([](std::exception_ptr pointer) {
    try {
      std::rethrow_exception(pointer);
    } catch (const DesyncError& error) {
      PyErr_SetString(g_exceptions.desync, with_keyword_names(error.what()).c_str());
    } catch (const TimeoutError& error) {
      PyErr_SetString(g_exceptions.timeout, with_keyword_names(error.what()).c_str());
    } catch (const CommError& error) {
      PyErr_SetString(g_exceptions.comm, with_keyword_names(error.what()).c_str());
    } catch (const ArgumentTypeError& error) {
      PyErr_SetString(g_exceptions.argument_type, with_keyword_names(error.what()).c_str());
    } catch (const ParseError& error) {
      PyErr_SetString(g_exceptions.parse, with_keyword_names(error.what()).c_str());
    } catch (const InvalidArgument& error) {
      PyErr_SetString(g_exceptions.invalid, with_keyword_names(error.what()).c_str());
    } catch (const ResourceError& error) {
      PyErr_SetString(g_exceptions.resource, with_keyword_names(error.what()).c_str());
    } catch (const DataError& error) {
      PyErr_SetString(g_exceptions.data, with_keyword_names(error.what()).c_str());
    } catch (const Error& error) {
      PyErr_SetString(g_exceptions.error, with_keyword_names(error.what()).c_str());
    }
  });
}

}  // namespace

std::string with_keyword_names(std::string_view message) {
  return with_setting_names(message, [](std::string_view field) { return std::string(field); });
}

py::object python_of(const nlohmann::json& json) {
  return py::module_::import("json").attr("loads")(json.dump());
}

std::string setting_text(const py::handle& value, std::string_view argument) {
  if (py::isinstance<py::bool_>(value)) return value.cast<bool>() ? "true" : "false";
  if (py::isinstance<py::str>(value)) return value.cast<std::string>();
  if (py::hasattr(value, "__index__"))
    return py::str(py::int_(py::reinterpret_borrow<py::object>(value))).cast<std::string>();
  if (py::hasattr(value, "__float__"))
    return py::repr(py::float_(py::reinterpret_borrow<py::object>(value))).cast<std::string>();
  if (py::isinstance<py::sequence>(value)) {
    std::string text;
    for (const auto& item : value.cast<py::sequence>()) {
      const bool size = py::isinstance<py::int_>(item) && !py::isinstance<py::bool_>(item);
      if (!size && !py::isinstance<py::str>(item)) {
        throw ArgumentTypeError(
            fmt::format("{} must hold sizes or names, got {}", argument, describe_value(value)));
      }
      text += (text.empty() ? "" : (size ? "x" : ",")) + py::str(item).cast<std::string>();
    }
    return text;
  }
  throw ArgumentTypeError(fmt::format("{} must be a number, a string, a bool or a sequence, got {}",
                                      argument, describe_value(value)));
}

std::string describe_value(const py::handle& value) {
  constexpr std::size_t kShown = 80;
  std::string repr;
  try {
    repr = py::repr(value).cast<std::string>();
  } catch (const py::error_already_set&) {
    repr = "<repr failed>";
  }
  if (repr.size() > kShown) repr = repr.substr(0, kShown) + "...";
  return fmt::format("{} {}", py::str(py::type::of(value).attr("__name__")).cast<std::string>(),
                     repr);
}

}  // namespace meshtensor::python

PYBIND11_MODULE(_meshtensor, module) {
  using namespace meshtensor::python;
  module.doc() = "meshtensor's C++ core; import the `meshtensor` package instead.";
  bind_exceptions(module);
  bind_arrays(module);
  bind_runtime(module);
  bind_mesh(module);
  bind_dtensor(module);
  bind_ops(module);
  bind_generate(module);
  bind_train(module);
  bind_rl(module);
}
