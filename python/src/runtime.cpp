#include <chrono>
#include <cstdlib>
#include <mutex>
#include <optional>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <meshtensor/comm/mpi_backend.hpp>
#include <meshtensor/comm/threads_backend.hpp>
#include <meshtensor/core/error.hpp>
#include <meshtensor/core/storage.hpp>

#include "bindings.hpp"

namespace meshtensor::python {

namespace {

thread_local std::shared_ptr<comm::Communicator> t_world;  // the rank this thread runs
std::unique_ptr<comm::MpiWorld> g_mpi;                     // this process's mpirun rank
std::shared_ptr<comm::Communicator> g_mpi_world;

bool under_mpirun() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMIX_RANK") != nullptr;
}

std::shared_ptr<comm::Communicator> mpi_world() {
  if (!g_mpi) {
    g_mpi = std::make_unique<comm::MpiWorld>(nullptr, nullptr);
    g_mpi_world = g_mpi->communicator();
  }
  return g_mpi_world;
}

// Makes `world` the calling thread's world for the scope's life.
class WorldScope {
 public:
  explicit WorldScope(std::shared_ptr<comm::Communicator> world) : previous_(std::move(t_world)) {
    t_world = std::move(world);
  }
  WorldScope(const WorldScope&) = delete;
  WorldScope& operator=(const WorldScope&) = delete;
  ~WorldScope() { t_world = std::move(previous_); }

 private:
  std::shared_ptr<comm::Communicator> previous_;
};

// Raised on a rank thread in place of the Python exception it stands for (which needs the GIL),
// so that run_threads can abort the world; the exception itself is raised again on the caller.
class RankFailed : public Error {
 public:
  RankFailed(int rank, const std::string& message) : Error(message), rank_(rank) {}
  int rank() const { return rank_; }

 private:
  int rank_;
};

std::string python_error_text(const py::error_already_set& error) {
  const py::object lines =
      py::module_::import("traceback")
          .attr("format_exception")(error.type(), error.value(), error.trace());
  return py::str("").attr("join")(lines).cast<std::string>();
}

// The Python thread ids of the ranks still running their function, so that Ctrl-C reaches the
// ones running Python code (those waiting in a collective are woken by the abort).
class RunningRanks {
 public:
  explicit RunningRanks(int ranks) : ids_(static_cast<std::size_t>(std::max(ranks, 0)), 0) {}
  void start(int rank) {
    const std::lock_guard lock(mutex_);
    ids_[static_cast<std::size_t>(rank)] = PyThread_get_thread_ident();
  }
  void stop(int rank) {
    const std::lock_guard lock(mutex_);
    ids_[static_cast<std::size_t>(rank)] = 0;
  }
  // Raises `error` in every running rank's thread at its next Python instruction (GIL held).
  void interrupt(PyObject* error) {
    const std::lock_guard lock(mutex_);
    for (const unsigned long id : ids_)
      if (id != 0) PyThreadState_SetAsyncExc(id, error);
  }

 private:
  std::mutex mutex_;
  std::vector<unsigned long> ids_;
};

py::list run_threads(int ranks, const py::object& fn, const std::optional<std::string>& link) {
  std::vector<py::object> results(static_cast<std::size_t>(std::max(ranks, 0)));
  std::vector<std::optional<py::error_already_set>> errors(results.size());
  comm::LinkDelay delay = link ? comm::parse_link(*link) : comm::LinkDelay{};
  RunningRanks running(ranks);
  // Ctrl-C: Python runs signal handlers on the main thread only, which waits here without the
  // GIL; check for them between waits and interrupt the ranks.
  const auto poll = [&running] {
    const py::gil_scoped_acquire gil;
    if (PyErr_CheckSignals() != 0) {
      py::error_already_set error;
      running.interrupt(error.type().ptr());
      throw error;
    }
  };
  const auto clear_errors = [&errors] {
    for (auto& error : errors)
      error.reset();
  };
  try {
    const py::gil_scoped_release release;
    comm::run_threads(
        ranks,
        [&](std::shared_ptr<comm::Communicator> world) {
          const int rank = world->rank();
          const py::gil_scoped_acquire gil;
          const WorldScope scope(world);
          running.start(rank);
          try {
            results[static_cast<std::size_t>(rank)] = fn(py::cast(std::move(world)));
            running.stop(rank);
          } catch (py::error_already_set& error) {
            running.stop(rank);
            const std::string what = error.what();
            errors[static_cast<std::size_t>(rank)] = std::move(error);
            throw RankFailed(rank, what);
          }
        },
        std::move(delay), poll);
  } catch (const RankFailed& failed) {
    errors[static_cast<std::size_t>(failed.rank())]->restore();
    clear_errors();
    throw py::error_already_set();
  } catch (py::error_already_set&) {  // the interruption poll raised
    clear_errors();
    throw;
  }
  py::list list;
  for (py::object& result : results)
    list.append(result);
  return list;
}

py::object run_mpi(const py::object& fn) {
  std::shared_ptr<comm::Communicator> world = mpi_world();
  const WorldScope scope(world);
  try {
    return fn(py::cast(world));
  } catch (py::error_already_set& error) {
    // The other ranks would wait for this one in their next collective: end the job, as a C++
    // program under run_mpi does.
    const std::string message =
        fmt::format("world rank {} failed: {}", world->rank(), python_error_text(error));
    g_mpi->abort(message);
  }
}

void finalize_mpi() {
  g_mpi_world.reset();
  g_mpi.reset();
}

comm::CollectiveOptions collective_options(const std::string& op, const std::string& mode,
                                           const std::optional<double>& timeout,
                                           const std::string& label) {
  comm::CollectiveOptions options;
  options.op = parse_reduce_op(op);
  options.mode = mode_from(mode);
  if (timeout) options.timeout = comm::timeout_from_seconds(*timeout, "timeout");
  options.label = label;
  return options;
}

std::vector<std::int64_t> counts_from(const std::optional<std::vector<std::int64_t>>& counts) {
  return counts ? *counts : std::vector<std::int64_t>{};
}

// The result shape of a collective: `even` without per-rank counts, else the 1-d sum of `counts`
// (negative counts are left to the collective's own checks, which name them).
Shape result_shape(const Shape& even, const std::optional<std::vector<std::int64_t>>& counts) {
  if (!counts) return even;
  std::int64_t total = 0;
  for (const std::int64_t count : *counts) {
    if (__builtin_add_overflow(total, std::max<std::int64_t>(count, 0), &total)) {
      throw InvalidArgument(
          fmt::format("counts [{}] add up to more elements than a tensor holds (2^63 - 1)",
                      list_excerpt(*counts)));
    }
  }
  return Shape{total};
}

// Every rank's `input` stacked along dim 0 (a scalar per rank: 1-d).
Shape gathered_shape(const Shape& input, int size) {
  if (input.rank() == 0) return Shape{size};
  std::vector<std::int64_t> dims = input.dims();
  if (__builtin_mul_overflow(dims[0], std::int64_t{size}, &dims[0])) {
    throw InvalidArgument(fmt::format("all_gather of shape {} over {} ranks overflows dim 0",
                                      input.to_string(), size));
  }
  return Shape(std::move(dims));
}

void bind_communicator(py::module_& module) {
  using comm::Communicator;
  py::class_<Communicator, std::shared_ptr<Communicator>>(
      module, "Communicator",
      "A group of ranks that run collectives together (the world, a mesh dim's group, a split). "
      "Every call is collective: all members make the same calls in the same order. Arrays are "
      "NumPy arrays; in-place calls write into them.")
      .def_property_readonly("rank", &Communicator::rank, "This rank's position in the group.")
      .def_property_readonly("size", &Communicator::size, "Number of ranks in the group.")
      .def_property_readonly(
          "backend", [](const Communicator& c) { return std::string(c.backend()); },
          "'threads' or 'mpi'.")
      .def_property_readonly("world_ranks", &Communicator::world_ranks,
                             "The members' world ranks, in group order.")
      .def(
          "all_reduce",
          [](Communicator& c, const py::object& array, const std::string& op,
             const std::string& mode, std::optional<double> timeout, const std::string& label) {
            Tensor tensor = tensor_from_array(array);
            const comm::CollectiveOptions options = collective_options(op, mode, timeout, label);
            {
              const py::gil_scoped_release release;
              c.all_reduce(tensor, options);
            }
            return write_back(array, tensor);
          },
          py::arg("array"), py::arg("op") = "sum", py::kw_only(), py::arg("mode") = "ordered",
          py::arg("timeout") = py::none(), py::arg("label") = "",
          "array = op over every rank's array, in place (op: sum, avg, max, min; mode: ordered, "
          "exact or native). Returns the array.")
      .def(
          "broadcast",
          [](Communicator& c, const py::object& array, int src, std::optional<double> timeout,
             const std::string& label) {
            Tensor tensor = tensor_from_array(array);
            const comm::CollectiveOptions options =
                collective_options("sum", "ordered", timeout, label);
            {
              const py::gil_scoped_release release;
              c.broadcast(tensor, src, options);
            }
            return write_back(array, tensor);
          },
          py::arg("array"), py::arg("src") = 0, py::kw_only(), py::arg("timeout") = py::none(),
          py::arg("label") = "", "array = rank src's array, in place. Returns the array.")
      .def(
          "all_gather",
          [](Communicator& c, const py::object& array,
             const std::optional<std::vector<std::int64_t>>& counts, std::optional<double> timeout,
             const std::string& label) {
            const Tensor input = tensor_from_array(array);
            Tensor output(result_shape(gathered_shape(input.shape(), c.size()), counts),
                          input.dtype());
            const comm::CollectiveOptions options =
                collective_options("sum", "ordered", timeout, label);
            {
              const py::gil_scoped_release release;
              c.all_gather(input, output, counts_from(counts), options);
            }
            return array_from_tensor(output);
          },
          py::arg("array"), py::arg("counts") = py::none(), py::kw_only(),
          py::arg("timeout") = py::none(), py::arg("label") = "",
          "Every rank's array back to back along dim 0 (torch's all_gather_into_tensor). With "
          "counts (elements per rank) the contributions may differ in size and the result is 1-d.")
      .def(
          "reduce_scatter",
          [](Communicator& c, const py::object& array, const std::string& op,
             const std::optional<std::vector<std::int64_t>>& counts, const std::string& mode,
             std::optional<double> timeout, const std::string& label) {
            const Tensor input = tensor_from_array(array);
            Shape shape;
            if (counts) {
              const auto mine = static_cast<std::size_t>(c.rank());
              shape = Shape{mine < counts->size() ? std::max<std::int64_t>((*counts)[mine], 0) : 0};
            } else {
              if (input.rank() == 0 || input.shape()[0] % c.size() != 0) {
                throw InvalidArgument(fmt::format(
                    "reduce_scatter: dim 0 of shape {} does not split into {} equal parts; pass "
                    "counts",
                    input.shape().to_string(), c.size()));
              }
              std::vector<std::int64_t> dims = input.shape().dims();
              dims[0] /= c.size();
              shape = Shape(std::move(dims));
            }
            Tensor output(shape, input.dtype());
            const comm::CollectiveOptions options = collective_options(op, mode, timeout, label);
            {
              const py::gil_scoped_release release;
              c.reduce_scatter(input, output, counts_from(counts), options);
            }
            return array_from_tensor(output);
          },
          py::arg("array"), py::arg("op") = "sum", py::arg("counts") = py::none(), py::kw_only(),
          py::arg("mode") = "ordered", py::arg("timeout") = py::none(), py::arg("label") = "",
          "This rank's part of op over every rank's array: part i is the i-th of equal parts "
          "along dim 0, or counts[i] elements (the result then 1-d).")
      .def(
          "all_to_all",
          [](Communicator& c, const py::object& array,
             const std::optional<std::vector<std::int64_t>>& send_counts,
             const std::optional<std::vector<std::int64_t>>& recv_counts,
             std::optional<double> timeout, const std::string& label) {
            const Tensor input = tensor_from_array(array);
            Tensor output(result_shape(input.shape(), recv_counts), input.dtype());
            const comm::CollectiveOptions options =
                collective_options("sum", "ordered", timeout, label);
            {
              const py::gil_scoped_release release;
              c.all_to_all(input, output, counts_from(send_counts), counts_from(recv_counts),
                           options);
            }
            return array_from_tensor(output);
          },
          py::arg("array"), py::arg("send_counts") = py::none(),
          py::arg("recv_counts") = py::none(), py::kw_only(), py::arg("timeout") = py::none(),
          py::arg("label") = "",
          "Part i of array goes to rank i; part i of the result comes from rank i (equal parts of "
          "the flattened array, or the given counts; with counts the result is 1-d).")
      .def(
          "barrier",
          [](Communicator& c, std::optional<double> timeout) {
            const comm::CollectiveOptions options =
                collective_options("sum", "ordered", timeout, "");
            const py::gil_scoped_release release;
            c.barrier(options);
          },
          py::kw_only(), py::arg("timeout") = py::none(), "Returns once every rank called it.")
      .def(
          "split",
          [](Communicator& c, std::int64_t color, std::int64_t key) {
            const py::gil_scoped_release release;
            return c.split(color, key, comm::CollectiveOptions{});
          },
          py::arg("color"), py::arg("key") = 0,
          "Members passing the same color >= 0 form a new group ordered by (key, rank); a "
          "negative color gives None.")
      .def("__repr__", [](const Communicator& c) {
        return fmt::format("Communicator(rank={}, size={}, backend='{}')", c.rank(), c.size(),
                           c.backend());
      });
}

}  // namespace

std::shared_ptr<comm::Communicator> current_world() {
  if (t_world) return t_world;
  if (g_mpi_world) return g_mpi_world;
  if (under_mpirun()) return mpi_world();
  throw InvalidArgument(
      "no world on this thread: call this inside meshtensor.run / run_threads / run_mpi, run the "
      "script under mpirun, or pass world=");
}

std::shared_ptr<comm::Communicator> world_or_current(const py::object& world) {
  if (world.is_none()) return current_world();
  if (!py::isinstance<comm::Communicator>(world)) {
    throw ArgumentTypeError(
        fmt::format("world must be a Communicator or None, got {}", describe_value(world)));
  }
  return world.cast<std::shared_ptr<comm::Communicator>>();
}

comm::ReductionMode mode_from(const std::string& text) {
  return comm::parse_reduction_mode(text);
}

void bind_runtime(py::module_& module) {
  bind_communicator(module);
  module.def("run_threads", &run_threads, py::arg("ranks"), py::arg("fn"),
             py::arg("link") = py::none(),
             "Runs fn(world) on `ranks` threads of this process, one per rank, and returns their "
             "results by rank. Collectives release the GIL. When a rank raises, the others' "
             "collectives fail with CommError and the first exception is raised here. `link` "
             "('LATENCY,GBPS', e.g. '20us,10') simulates a network.");
  module.def("run_mpi", &run_mpi, py::arg("fn"),
             "Runs fn(world) on this process's rank of an mpirun job and returns its result; an "
             "exception aborts the whole job with the rank and the traceback.");
  module.def("under_mpirun", &under_mpirun, "True when the process was started by mpirun.");
  module.def("get_world", &current_world,
             "The world communicator of the calling rank (under mpirun: made on first use).");
  module.def("release_cached_storage", &release_cached_storage,
             "Hands the freed tensor memory that waits for reuse back to the system (as "
             "torch.cuda.empty_cache does) and returns its bytes; tensors in use are untouched.");
  module.def("_finalize_mpi", &finalize_mpi);
}

}  // namespace meshtensor::python
