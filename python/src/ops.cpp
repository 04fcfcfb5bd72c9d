#include <functional>
#include <optional>

#include <fmt/format.h>

#include <meshtensor/comm/agree.hpp>
#include <meshtensor/dtensor/comm_debug.hpp>
#include <meshtensor/tp/ops.hpp>

#include "bindings.hpp"

namespace meshtensor::python {

namespace {

dtensor::MatmulForm form_from(const std::string& text) {
  for (const auto form :
       {dtensor::MatmulForm::nn, dtensor::MatmulForm::nt, dtensor::MatmulForm::tn})
    if (dtensor::matmul_form_name(form) == text) return form;
  throw InvalidArgument(fmt::format("matmul form '{}' is not nn, nt or tn", text));
}

/// Runs an op on DTensors of one mesh after checking that every rank asks for the same op on the
/// same shapes and placements (else every rank raises the same InvalidArgument).
PyDTensor run_op(const std::string& op, const std::vector<const PyDTensor*>& inputs,
                 const std::string& mode, const std::string& extra,
                 const std::function<dtensor::DTensor(const dtensor::RedistributeOptions&)>& body) {
  const std::shared_ptr<Mesh>& mesh = inputs.front()->mesh;
  std::string text = op + " " + extra + " mode " + mode;
  for (const PyDTensor* x : inputs) {
    if (!(x->mesh->mesh == mesh->mesh)) {
      throw InvalidArgument(fmt::format("{}: inputs on meshes {} and {}", op,
                                        mesh->mesh.to_string(), x->mesh->mesh.to_string()));
    }
    text += fmt::format(" {} {} {}", dtype_name(x->tensor.dtype()),
                        x->tensor.global_shape().to_string(), x->tensor.spec().to_string());
  }
  dtensor::RedistributeOptions options;
  options.mode = mode_from(mode);
  const py::gil_scoped_release release;
  comm::check_same_on_every_rank(*mesh->world, op + "'s inputs", text);
  return PyDTensor{mesh, body(options)};
}

/// Records the DTensor ops and collectives of the calling rank while the context is open.
struct PyCommDebugMode {
  std::unique_ptr<dtensor::CommDebugMode> mode;
  std::string text;
  std::string json;

  PyCommDebugMode& enter() {
    if (mode) throw InvalidArgument("CommDebugMode is already open");
    mode = std::make_unique<dtensor::CommDebugMode>();
    return *this;
  }
  void exit() {
    if (!mode) return;
    text = mode->to_text();
    json = mode->to_json().dump();
    mode.reset();
  }
  std::string current_text() const { return mode ? mode->to_text() : text; }
  py::object data() const {
    const std::string dump = mode ? mode->to_json().dump() : (json.empty() ? "{}" : json);
    return py::module_::import("json").attr("loads")(dump);
  }
};

void bind_debug_mode(py::module_& module) {
  py::class_<PyCommDebugMode>(
      module, "CommDebugMode",
      "Context manager recording, on the calling rank, every DTensor op and redistribute run "
      "inside it: the placements given, the strategy sharding propagation chose, and each "
      "collective (kind, mesh dims, bytes).")
      .def(py::init<>())
      .def("__enter__", &PyCommDebugMode::enter, py::return_value_policy::reference)
      .def("__exit__", [](PyCommDebugMode& m, const py::args&) { m.exit(); })
      .def_property_readonly(
          "ops", [](const PyCommDebugMode& m) { return m.data().attr("get")("ops", py::list()); },
          "One dict per op: op, given, strategy {inputs, output, cost_s, candidates, ...}, "
          "collectives [{kind, mesh_dims, group_size, send_bytes, purpose}].")
      .def(
          "counts",
          [](const PyCommDebugMode& m) { return m.data().attr("get")("counts", py::dict()); },
          "Collectives per kind.")
      .def(
          "count",
          [](const PyCommDebugMode& m, const std::string& kind) {
            const py::dict counts = m.data().attr("get")("counts", py::dict());
            std::int64_t n = 0;
            for (const auto& [k, v] : counts)
              if (kind.empty() || k.cast<std::string>() == kind) n += v.cast<std::int64_t>();
            return n;
          },
          py::arg("kind") = "", "Number of collectives of `kind` (all kinds when empty).")
      .def("__str__", &PyCommDebugMode::current_text);
}

}  // namespace

void bind_ops(py::module_& module) {
  bind_debug_mode(module);
  py::module_ ops = module.def_submodule(
      "ops",
      "Compute ops on DTensors with sharding propagation: each picks the cheapest of its "
      "strategies with the planner's cost model, moves the inputs there, and runs on the local "
      "blocks (see CommDebugMode). Collective: every rank calls them alike.");
  ops.def(
      "matmul",
      [](const PyDTensor& a, const PyDTensor& b, const std::string& form, const std::string& mode) {
        const dtensor::MatmulForm f = form_from(form);
        return run_op("matmul", {&a, &b}, mode, form,
                      [&](const auto& o) { return tp::matmul(a.tensor, b.tensor, f, o); });
      },
      py::arg("a"), py::arg("b"), py::kw_only(), py::arg("form") = "nn",
      py::arg("mode") = "ordered",
      "a·b ('nn', b [k, n]), a·bᵀ ('nt', b [n, k]) or aᵀ·b summed over the leading dims ('tn').");
  ops.def(
      "add",
      [](const PyDTensor& a, const PyDTensor& b, const std::string& mode) {
        return run_op("add", {&a, &b}, mode, "",
                      [&](const auto& o) { return tp::add(a.tensor, b.tensor, o); });
      },
      py::arg("a"), py::arg("b"), py::kw_only(), py::arg("mode") = "ordered",
      "a + b (b's shape a suffix of a's).");
  ops.def(
      "scale",
      [](const PyDTensor& x, double factor, const std::string& mode) {
        return run_op("scale", {&x}, mode, fmt::format("{}", factor),
                      [&](const auto& o) { return tp::scale(x.tensor, factor, o); });
      },
      py::arg("x"), py::arg("factor"), py::kw_only(), py::arg("mode") = "ordered", "x · factor.");
  ops.def(
      "gelu",
      [](const PyDTensor& x, const std::string& mode) {
        return run_op("gelu", {&x}, mode, "", [&](const auto& o) { return tp::gelu(x.tensor, o); });
      },
      py::arg("x"), py::kw_only(), py::arg("mode") = "ordered", "GELU (tanh form).");
  ops.def(
      "layer_norm",
      [](const PyDTensor& x, const PyDTensor& w, const PyDTensor& b, double epsilon,
         const std::string& mode) {
        return run_op("layer_norm", {&x, &w, &b}, mode, fmt::format("{}", epsilon),
                      [&](const auto& o) {
                        return tp::layer_norm(x.tensor, w.tensor, b.tensor, epsilon, o);
                      });
      },
      py::arg("x"), py::arg("weight"), py::arg("bias"), py::kw_only(), py::arg("eps") = 1e-5,
      py::arg("mode") = "ordered", "Layer norm over the last dim.");
  ops.def(
      "softmax",
      [](const PyDTensor& x, const std::string& mode) {
        return run_op("softmax", {&x}, mode, "",
                      [&](const auto& o) { return tp::softmax(x.tensor, o); });
      },
      py::arg("x"), py::kw_only(), py::arg("mode") = "ordered", "Softmax over the last dim.");
  ops.def(
      "attention",
      [](const PyDTensor& q, const PyDTensor& k, const PyDTensor& v, const std::string& mode) {
        return run_op("attention", {&q, &k, &v}, mode, "", [&](const auto& o) {
          return tp::attention(q.tensor, k.tensor, v.tensor, o);
        });
      },
      py::arg("q"), py::arg("k"), py::arg("v"), py::kw_only(), py::arg("mode") = "ordered",
      "Causal attention of [batch, heads, sequence, head_dim] tensors.");
  ops.def(
      "embedding",
      [](const PyDTensor& table, const PyDTensor& ids, const std::string& mode) {
        return run_op("embedding", {&table, &ids}, mode, "",
                      [&](const auto& o) { return tp::embedding(table.tensor, ids.tensor, o); });
      },
      py::arg("table"), py::arg("ids"), py::kw_only(), py::arg("mode") = "ordered",
      "Rows of table [rows, dim] at int32 ids.");
  ops.def(
      "cross_entropy",
      [](const PyDTensor& logits, const PyDTensor& labels, const std::string& mode) {
        return run_op("cross_entropy", {&logits, &labels}, mode, "", [&](const auto& o) {
          return tp::cross_entropy(logits.tensor, labels.tensor, o);
        });
      },
      py::arg("logits"), py::arg("labels"), py::kw_only(), py::arg("mode") = "ordered",
      "Mean cross-entropy (float64 scalar DTensor); vocabulary-parallel when the classes are "
      "sharded and that is the cheapest strategy.");
}

}  // namespace meshtensor::python
