#include <mutex>
#include <vector>

#include <fmt/format.h>

#include <meshtensor/core/digest.hpp>
#include <meshtensor/core/error.hpp>
#include <meshtensor/kernels/elementwise.hpp>

#include "bindings.hpp"

namespace meshtensor::python {

namespace {

// Arrays whose Tensor went on a thread without the GIL (a rank's queue thread, say): dropped
// later by a thread that holds it. Taking the GIL there could deadlock against a thread that
// holds it while waiting for that queue.
std::mutex g_pending_mutex;
std::vector<py::object*> g_pending;

void drop_pending() {
  std::vector<py::object*> pending;
  {
    const std::lock_guard lock(g_pending_mutex);
    pending.swap(g_pending);
  }
  for (py::object* held : pending)
    delete held;
}

int drop_pending_call(void*) {
  drop_pending();
  return 0;
}

// Drops the array a wrapped Tensor kept alive: at once when this thread holds the GIL, else on
// the main thread's next pending call (at interpreter shutdown the reference is left).
void release_array(py::object* held) {
  if (Py_IsInitialized() == 0 || _Py_IsFinalizing() != 0) return;
  if (PyGILState_Check() != 0) {
    delete held;
    return;
  }
  bool schedule = false;
  {
    const std::lock_guard lock(g_pending_mutex);
    schedule = g_pending.empty();
    g_pending.push_back(held);
  }
  if (schedule) Py_AddPendingCall(&drop_pending_call, nullptr);
}

py::dtype numpy_dtype(DType dtype) {
  switch (dtype) {
    case DType::f64:
      return py::dtype::of<double>();
    case DType::f32:
    case DType::bf16:  // handed out as float32 copies
      return py::dtype::of<float>();
    case DType::f16:
      return py::dtype("float16");
    case DType::i64:
      return py::dtype::of<std::int64_t>();
    case DType::i32:
      return py::dtype::of<std::int32_t>();
    case DType::u8:
      return py::dtype::of<std::uint8_t>();
  }
  throw InvalidArgument("invalid dtype");
}

}  // namespace

DType dtype_of_array(const py::array& array) {
  const py::dtype dtype = array.dtype();
  const char kind = dtype.kind();
  const auto size = dtype.itemsize();
  const char order = dtype.byteorder();
  if (order == '<' || order == '=' || order == '|') {
    if (kind == 'f' && size == 8) return DType::f64;
    if (kind == 'f' && size == 4) return DType::f32;
    if (kind == 'f' && size == 2) return DType::f16;
    if (kind == 'i' && size == 8) return DType::i64;
    if (kind == 'i' && size == 4) return DType::i32;
    if (kind == 'u' && size == 1) return DType::u8;
    if (kind == 'b' && size == 1) return DType::u8;
  }
  throw InvalidArgument(fmt::format(
      "NumPy dtype '{}' has no meshtensor dtype (float64, float32, float16, int64, int32, uint8)",
      py::str(static_cast<const py::handle&>(dtype)).cast<std::string>()));
}

Tensor tensor_from_array(const py::handle& object) {
  drop_pending();
  auto array = py::array::ensure(object);
  if (!array) {
    PyErr_Clear();
    throw InvalidArgument(
        fmt::format("expected an array, got {}", py::repr(object).cast<std::string>()));
  }
  const DType dtype = dtype_of_array(array);
  const int flags = array.flags();
  const bool direct = (flags & py::array::c_style) != 0 &&
                      (flags & py::detail::npy_api::NPY_ARRAY_ALIGNED_) != 0 && array.writeable() &&
                      array.dtype().kind() != 'b';
  if (!direct) {
    py::object copy =
        py::module_::import("numpy").attr("array")(array, py::arg("dtype") = numpy_dtype(dtype),
                                                   py::arg("order") = "C", py::arg("copy") = true);
    array = copy.cast<py::array>();
  }
  std::vector<std::int64_t> dims(array.shape(), array.shape() + array.ndim());
  auto* held = new py::object(array);
  std::shared_ptr<std::byte[]> storage(static_cast<std::byte*>(array.mutable_data()),
                                       [held](std::byte*) { release_array(held); });
  return Tensor::wrap(std::move(storage), Shape(std::move(dims)), dtype);
}

py::array array_from_tensor(const Tensor& tensor) {
  Tensor source =
      tensor.dtype() == DType::bf16 ? kernels::convert(tensor, DType::f32) : tensor.contiguous();
  std::vector<py::ssize_t> dims(source.shape().dims().begin(), source.shape().dims().end());
  auto* kept = new Tensor(source);
  const py::capsule base(kept, [](void* pointer) { delete static_cast<Tensor*>(pointer); });
  return py::array(numpy_dtype(source.dtype()), dims, {}, static_cast<void*>(kept->bytes().data()),
                   base);
}

Shape shape_from(const py::handle& object) {
  try {
    if (py::isinstance<py::int_>(object)) return Shape{object.cast<std::int64_t>()};
    return Shape(object.cast<std::vector<std::int64_t>>());
  } catch (const py::cast_error&) {
    throw InvalidArgument(fmt::format("expected a shape (a sequence of ints), got {}",
                                      py::repr(object).cast<std::string>()));
  }
}

py::object write_back(const py::object& original, const Tensor& tensor) {
  py::array result = array_from_tensor(tensor);
  if (!py::isinstance<py::array>(original)) return result;
  if (original.cast<py::array>().data() != result.data())
    original.attr("__setitem__")(py::ellipsis(), result);
  return original;
}

py::tuple as_tuple(const std::vector<std::int64_t>& values) {
  return py::tuple(py::cast(values));
}

void bind_arrays(py::module_& module) {
  module.def(
      "digest",
      [](const py::handle& array) { return digest_hex(tensor_from_array(array).digest()); },
      py::arg("array"),
      "Digest (16 hex digits) of an array's dtype, shape and element bits: the digest meshtensor's "
      "C++ Tensor::digest gives the same data.");
}

}  // namespace meshtensor::python
