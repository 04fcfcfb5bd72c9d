#include <fmt/format.h>

#include <meshtensor/checkpoint/checkpoint.hpp>
#include <meshtensor/core/digest.hpp>
#include <meshtensor/core/error.hpp>
#include <meshtensor/core/memory.hpp>
#include <meshtensor/fsdp/sharded_model.hpp>
#include <meshtensor/nn/loss.hpp>
#include <meshtensor/nn/mlp.hpp>
#include <meshtensor/nn/optim.hpp>
#include <meshtensor/train/dataset.hpp>
#include <meshtensor/train/model_state.hpp>
#include <meshtensor/train/trainer.hpp>

#include "bindings.hpp"

namespace meshtensor::python {

namespace {

/// A loaded data set, shared by the arrays that view it.
struct PyDataset {
  std::shared_ptr<train::Dataset> data;
};

/// An MLP and, once fully_shard / replicate ran, its runtime on a mesh.
struct PyModel {
  nn::MlpConfig config;
  std::unique_ptr<nn::Sequential> module;
  std::shared_ptr<Mesh> mesh;
  std::unique_ptr<fsdp::ShardedModel> sharded;  // after module and mesh: destroyed first

  PyModel() = default;
  PyModel(const PyModel&) = delete;
  PyModel& operator=(const PyModel&) = delete;
  ~PyModel() {
    // The runtime waits for its queues; they must not wait for the GIL meanwhile.
    if (PyGILState_Check() != 0) {
      const py::gil_scoped_release release;
      sharded.reset();
    }
  }

  fsdp::ShardedModel& runtime(const char* what) const {
    if (!sharded) {
      throw InvalidArgument(fmt::format(
          "{}: call fully_shard(model, mesh) or replicate(model, mesh) first (one rank: a mesh of "
          "shape (1,))",
          what));
    }
    return *sharded;
  }
};

/// An optimizer over a sharded model's local shards.
struct PyOptimizer {
  std::shared_ptr<PyModel> model;
  std::unique_ptr<nn::Optimizer> optimizer;
  double lr = 1e-3;
};

py::array view_bytes(const std::shared_ptr<train::Dataset>& data,
                     const std::vector<std::uint8_t>& bytes, std::vector<py::ssize_t> shape) {
  auto* kept = new std::shared_ptr<train::Dataset>(data);
  const py::capsule base(
      kept, [](void* pointer) { delete static_cast<std::shared_ptr<train::Dataset>*>(pointer); });
  py::array array(py::dtype::of<std::uint8_t>(), std::move(shape), {}, bytes.data(), base);
  array.attr("setflags")(py::arg("write") = false);
  return array;
}

train::ImageSet first_images(const train::ImageSet& set, std::int64_t count) {
  if (count < 0) throw InvalidArgument(fmt::format("limit must be at least 0, got {}", count));
  train::ImageSet result = set;
  result.count = std::min(count, set.count);
  result.pixels.resize(static_cast<std::size_t>(result.count * set.features()));
  result.labels.resize(static_cast<std::size_t>(result.count));
  return result;
}

py::dict result_dict(const train::TrainResult& result) {
  py::list epochs;
  for (const train::EpochReport& report : result.epochs) {
    py::dict epoch;
    epoch["epoch"] = report.epoch;
    epoch["steps"] = report.steps;
    epoch["samples"] = report.samples;
    epoch["train_loss"] = report.train_loss;
    epoch["train_accuracy"] = report.train_accuracy;
    epoch["test_accuracy"] = report.test_accuracy;
    epoch["samples_per_second"] = report.samples_per_second;
    epoch["seconds"] = report.seconds;
    epochs.append(epoch);
  }
  py::dict out;
  out["digest"] = digest_hex(result.digest);
  out["replicas_identical"] = result.replicas_identical;
  out["test_accuracy"] = result.test_accuracy;
  out["steps"] = result.steps;
  out["parameters"] = result.parameters;
  out["seconds"] = result.seconds;
  out["mesh"] = result.mesh;
  out["epochs"] = epochs;
  out["resumed_step"] = result.resumed_step;
  out["checkpoints"] = result.checkpoints;
  out["warnings"] = result.warnings;
  return out;
}

py::dict run_training(const PyDataset& dataset, const py::object& world_object,
                      const py::kwargs& kwargs) {
  train::TrainConfig config;
  config.epochs = 8;
  config.schedule.kind = nn::LrSchedule::Kind::cosine;
  py::object on_epoch = py::none();
  std::int64_t stop_after = 0;
  for (const auto& [key, value] : kwargs) {
    const auto name = key.cast<std::string>();  // keyword names are str
    const std::string argument = fmt::format("train() argument '{}'", name);
    const auto text = [&] { return py::str(value).cast<std::string>(); };
    if (name == "model") {
      config.model.hidden = nn::parse_mlp_hidden(text());
    } else if (name == "hidden") {
      config.model.hidden = cast_argument<std::vector<std::int64_t>>(value, argument);
    } else if (name == "activation") {
      config.model.activation = nn::parse_activation(text());
    } else if (name == "layernorm") {
      config.model.layernorm = cast_argument<bool>(value, argument);
    } else if (name == "epochs") {
      config.epochs = cast_argument<std::int64_t>(value, argument);
    } else if (name == "steps") {
      config.steps = cast_argument<std::int64_t>(value, argument);
    } else if (name == "batch") {
      config.batch = cast_argument<std::int64_t>(value, argument);
    } else if (name == "micro_batches") {
      config.micro_batches = cast_argument<std::int64_t>(value, argument);
    } else if (name == "optimizer") {
      config.optimizer = train::parse_optimizer(text());
    } else if (name == "lr") {
      config.schedule.base = cast_argument<double>(value, argument);
    } else if (name == "warmup") {
      config.schedule.warmup_steps = cast_argument<std::int64_t>(value, argument);
    } else if (name == "schedule") {
      config.schedule.kind = nn::parse_schedule_kind(text());
    } else if (name == "weight_decay") {
      config.weight_decay = cast_argument<double>(value, argument);
    } else if (name == "momentum") {
      config.momentum = cast_argument<double>(value, argument);
    } else if (name == "mode") {
      config.mode = mode_from(text());
    } else if (name == "seed") {
      config.seed = cast_argument<std::uint64_t>(value, argument);
    } else if (name == "strategy") {
      config.strategy = train::parse_strategy(text());
    } else if (name == "replicas") {
      config.replicas = cast_argument<std::int64_t>(value, argument);
    } else if (name == "reshard_after_forward") {
      config.reshard_after_forward = cast_argument<bool>(value, argument);
    } else if (name == "prefetch") {
      config.prefetch = cast_argument<int>(value, argument);
    } else if (name == "param_dtype") {
      config.param_dtype = parse_dtype(text());
    } else if (name == "reduce_dtype") {
      config.reduce_dtype = parse_dtype(text());
    } else if (name == "micro_batch_mode") {
      config.micro_batch_mode = train::parse_micro_batch_mode(text());
    } else if (name == "save") {
      config.save_dir = value.is_none() ? "" : text();
    } else if (name == "save_every") {
      config.save_every = cast_argument<std::int64_t>(value, argument);
    } else if (name == "keep_checkpoints") {
      config.keep_checkpoints = cast_argument<int>(value, argument);
    } else if (name == "resume") {
      config.resume_dir = value.is_none() ? "" : text();
    } else if (name == "stop_after") {
      stop_after = cast_argument<std::int64_t>(value, argument);
    } else if (name == "on_epoch") {
      on_epoch = py::reinterpret_borrow<py::object>(value);
    } else {
      throw InvalidArgument(fmt::format("train: unknown option '{}'", name));
    }
  }
  if (stop_after < 0)
    throw InvalidArgument(fmt::format("stop_after must be at least 0, got {}", stop_after));
  (config.steps > 0 ? config.stop_after : config.stop_after_epochs) = stop_after;
  train::TrainCallbacks callbacks;
  if (!on_epoch.is_none()) {
    callbacks.on_epoch = [&on_epoch](const train::EpochReport& report) {
      const py::gil_scoped_acquire gil;
      py::dict epoch;
      epoch["epoch"] = report.epoch;
      epoch["steps"] = report.steps;
      epoch["train_loss"] = report.train_loss;
      epoch["train_accuracy"] = report.train_accuracy;
      epoch["test_accuracy"] = report.test_accuracy;
      on_epoch(epoch);
    };
  }
  std::shared_ptr<comm::Communicator> world = world_or_current(world_object);
  train::TrainResult result;
  {
    const py::gil_scoped_release release;
    result = train::train(*world, *dataset.data, config, callbacks);
  }
  return result_dict(result);
}

std::shared_ptr<PyModel> make_model(std::int64_t inputs, const std::vector<std::int64_t>& hidden,
                                    std::int64_t outputs, const std::string& activation,
                                    bool layernorm, std::uint64_t seed) {
  auto model = std::make_shared<PyModel>();
  model->config.inputs = inputs;
  model->config.hidden = hidden;
  model->config.outputs = outputs;
  model->config.activation = nn::parse_activation(activation);
  model->config.layernorm = layernorm;
  model->config.seed = seed;
  for (const std::int64_t size : {inputs, outputs}) {
    if (size < 1) throw InvalidArgument(fmt::format("MLP sizes must be at least 1, got {}", size));
  }
  for (const std::int64_t size : hidden) {
    if (size < 1)
      throw InvalidArgument(fmt::format("MLP hidden sizes must be at least 1, got {}", size));
  }
  model->module = nn::make_mlp(model->config);
  return model;
}

// fully_shard / replicate: one parameter group per parameterised layer, as the trainer makes.
std::shared_ptr<PyModel> shard_model(const std::shared_ptr<PyModel>& model,
                                     const std::shared_ptr<Mesh>& mesh, bool replicate,
                                     bool reshard_after_forward, const std::string& mode,
                                     int prefetch, const std::string& param_dtype,
                                     const std::string& reduce_dtype) {
  const auto& groups = mesh->bound(replicate ? "replicate" : "fully_shard");
  if (model->sharded)
    throw InvalidArgument("the model is already sharded (fully_shard or replicate ran)");
  fsdp::FsdpConfig config;
  config.reshard_after_forward = reshard_after_forward;
  config.param_dtype = parse_dtype(param_dtype);
  config.reduce_dtype = parse_dtype(reduce_dtype);
  const int ndim = mesh->mesh.ndim();
  if (replicate) {
    for (int d = 0; d < ndim; ++d)
      config.replicate_mesh_dims.push_back(d);
  } else if (ndim == 1) {
    config.shard_mesh_dims = {0};
  } else if (ndim == 2) {
    config.replicate_mesh_dims = {0};
    config.shard_mesh_dims = {1};
  } else {
    throw InvalidArgument(fmt::format(
        "fully_shard takes a 1-d mesh (FSDP) or a 2-d (replicate, shard) mesh (HSDP), got {}",
        mesh->mesh.to_string()));
  }
  fsdp::RuntimeOptions options;
  options.mode = mode_from(mode);
  options.prefetch = prefetch;
  std::unique_ptr<fsdp::ShardedModel> sharded;
  {
    const py::gil_scoped_release release;  // making the groups is collective
    sharded = std::make_unique<fsdp::ShardedModel>(*model->module, *groups, options);
    for (std::size_t i = 0; i < model->module->size(); ++i) {
      nn::Module& layer = model->module->at(i);
      if (!layer.parameters().empty()) sharded->fully_shard(layer, config);
    }
  }
  model->mesh = mesh;
  model->sharded = std::move(sharded);
  return model;
}

std::vector<std::uint8_t> labels_from(const py::handle& labels) {
  const Tensor tensor = tensor_from_array(labels);
  std::vector<std::uint8_t> result(static_cast<std::size_t>(tensor.numel()));
  visit_dtype(tensor.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const auto values = tensor.values<T>();
    for (std::size_t i = 0; i < values.size(); ++i) {
      const double value = element_to_double(values[i]);
      if (!(value >= 0 && value < 256))
        throw InvalidArgument(fmt::format("label {} is not a class index", value));
      result[i] = static_cast<std::uint8_t>(value);
    }
  });
  return result;
}

Tensor f32_input(const py::handle& object, const char* what) {
  Tensor tensor = tensor_from_array(object);
  if (tensor.dtype() != DType::f32 || tensor.rank() != 2) {
    throw InvalidArgument(fmt::format("{} must be a 2-d float32 array, got {} of shape {}", what,
                                      dtype_name(tensor.dtype()), tensor.shape().to_string()));
  }
  return tensor;
}

py::array model_forward(PyModel& m, const py::object& x) {
  const Tensor input = f32_input(x, "input");
  fsdp::ShardedModel& sharded = m.runtime("forward");
  Tensor logits;
  {
    const py::gil_scoped_release release;
    logits = sharded.forward(input);
  }
  return array_from_tensor(logits);
}

void bind_models(py::module_& module) {
  py::class_<PyModel, std::shared_ptr<PyModel>>(
      module, "MLP",
      "inputs -> hidden... -> outputs, each hidden layer Linear (+ LayerNorm) + activation, with "
      "batch-invariant kernels. fully_shard / replicate put it on a mesh; then forward, backward "
      "and an optimizer train it.")
      .def(py::init(&make_model), py::arg("inputs") = 784,
           py::arg("hidden") = std::vector<std::int64_t>{1024, 1024}, py::arg("outputs") = 10,
           py::kw_only(), py::arg("activation") = "relu", py::arg("layernorm") = false,
           py::arg("seed") = 0)
      .def("forward", &model_forward, py::arg("x"),
           "Logits (float32 [rows, outputs]) of inputs x (float32 [rows, inputs]).")
      .def("__call__", &model_forward, py::arg("x"))
      .def(
          "backward",
          [](PyModel& m, const py::object& grad) {
            const Tensor grad_logits = f32_input(grad, "grad_logits");
            fsdp::ShardedModel& sharded = m.runtime("backward");
            const py::gil_scoped_release release;
            sharded.backward(grad_logits);
          },
          py::arg("grad_logits"),
          "Backward from the gradient of the last forward's logits; gradient reductions start as "
          "each layer finishes and, on the last backward of a step, are complete on return.")
      .def("zero_grad", [](PyModel& m) { m.runtime("zero_grad").zero_grad(); })
      .def(
          "set_is_last_backward",
          [](PyModel& m, bool value) {
            m.runtime("set_is_last_backward").set_is_last_backward(value);
          },
          py::arg("is_last_backward"))
      .def(
          "set_requires_gradient_sync",
          [](PyModel& m, bool value) {
            m.runtime("set_requires_gradient_sync").set_requires_gradient_sync(value);
          },
          py::arg("requires_gradient_sync"))
      .def(
          "set_requires_all_reduce",
          [](PyModel& m, bool value) {
            m.runtime("set_requires_all_reduce").set_requires_all_reduce(value);
          },
          py::arg("requires_all_reduce"))
      .def(
          "set_gradient_divide_factor",
          [](PyModel& m, std::optional<double> factor) {
            m.runtime("set_gradient_divide_factor").set_gradient_divide_factor(factor);
          },
          py::arg("factor"),
          "Gradients end divided by `factor` (e.g. the global batch) instead of the rank count; "
          "None restores the default.")
      .def("reshard",
           [](PyModel& m) {
             fsdp::ShardedModel& sharded = m.runtime("reshard");
             const py::gil_scoped_release release;
             sharded.reshard();
           })
      .def(
          "full_parameters",
          [](PyModel& m) {
            std::vector<Tensor> values;
            std::vector<std::string> names;
            for (const nn::Parameter* p : m.module->parameters())
              names.push_back(p->name);
            if (m.sharded) {
              const py::gil_scoped_release release;
              values = m.sharded->full_parameters();
            } else {
              for (const nn::Parameter* p : m.module->parameters())
                values.push_back(p->value.clone());
            }
            py::dict out;
            for (std::size_t i = 0; i < values.size(); ++i)
              out[py::str(names[i])] = array_from_tensor(values[i]);
            return out;
          },
          "Every parameter, whole, by name (gathered on every rank when sharded: collective).")
      .def(
          "digest",
          [](PyModel& m) {
            if (!m.sharded) return digest_hex(nn::parameters_digest(m.module->parameters()));
            const py::gil_scoped_release release;
            return digest_hex(m.sharded->full_parameters_digest());
          },
          "Digest of the parameters' names, shapes and bits: the `weights digest` that "
          "`meshtensor train` prints (collective when sharded).")
      .def(
          "save",
          [](PyModel& m, const std::string& root, std::int64_t step, PyOptimizer* optimizer,
             const std::map<std::string, std::string>& metadata, int keep) {
            fsdp::ShardedModel& sharded = m.runtime("save");
            comm::Communicator& world = sharded.groups().world();
            nn::Optimizer* state = optimizer != nullptr ? optimizer->optimizer.get() : nullptr;
            const py::gil_scoped_release release;
            const auto items = train::model_state(sharded, state, world.rank() == 0);
            checkpoint::SaveOptions options;
            options.metadata = metadata;
            options.keep = keep;
            return checkpoint::save(world, root, step, items, options);
          },
          py::arg("root"), py::arg("step") = 0, py::arg("optimizer") = nullptr, py::kw_only(),
          py::arg("metadata") = std::map<std::string, std::string>{}, py::arg("keep") = 0,
          "Saves the parameter shards ('model.<name>') and the optimizer's state as the "
          "checkpoint ROOT/step-NNNNNNNN, the same names `meshtensor train --save` uses; "
          "collective. Returns the directory.")
      .def(
          "load",
          [](PyModel& m, const std::string& path, PyOptimizer* optimizer) {
            fsdp::ShardedModel& sharded = m.runtime("load");
            comm::Communicator& world = sharded.groups().world();
            nn::Optimizer* state = optimizer != nullptr ? optimizer->optimizer.get() : nullptr;
            const py::gil_scoped_release release;
            const auto items = train::model_state(sharded, state, world.rank() == 0);
            const std::vector<Tensor> loaded =
                checkpoint::load(world, path, train::load_requests(items));
            train::restore_model_state(items, loaded, state);
          },
          py::arg("path"), py::arg("optimizer") = nullptr,
          "Loads parameter shards (and optimizer state) saved on any layout, from a checkpoint "
          "directory or a root with LATEST; collective. Nothing changes unless all of it loaded.")
      .def_property_readonly("is_sharded", [](const PyModel& m) { return m.sharded != nullptr; })
      .def("__repr__", [](const PyModel& m) {
        return fmt::format("MLP({}{})", m.module->describe(),
                           m.sharded ? ", on mesh " + m.mesh->mesh.to_string() : std::string());
      });

  module.def(
      "fully_shard",
      [](const std::shared_ptr<PyModel>& model, const std::shared_ptr<Mesh>& mesh,
         bool reshard_after_forward, const std::string& mode, int prefetch,
         const std::string& param_dtype, const std::string& reduce_dtype) {
        return shard_model(model, mesh, false, reshard_after_forward, mode, prefetch, param_dtype,
                           reduce_dtype);
      },
      py::arg("module"), py::arg("mesh"), py::kw_only(), py::arg("reshard_after_forward") = true,
      py::arg("mode") = "ordered", py::arg("prefetch") = 1, py::arg("param_dtype") = "f32",
      py::arg("reduce_dtype") = "f32",
      "Shards every layer's parameters over the mesh, as FSDP2's fully_shard applied to each "
      "layer and the root: a 1-d mesh shards over all ranks (FSDP), a 2-d mesh replicates over "
      "dim 0 and shards over dim 1 (HSDP). `mode` is the gradient reduction mode. Collective; "
      "returns the model.");
  module.def(
      "replicate",
      [](const std::shared_ptr<PyModel>& model, const std::shared_ptr<Mesh>& mesh,
         const std::string& mode) {
        return shard_model(model, mesh, true, true, mode, 1, "f32", "f32");
      },
      py::arg("module"), py::arg("mesh"), py::kw_only(), py::arg("mode") = "ordered",
      "Data parallel (DDP): every rank holds every parameter; gradients all-reduce over the "
      "mesh. Returns the model.");

  py::class_<PyOptimizer>(module, "Optimizer",
                          "Steps a sharded model's local shards (state sharded alike).")
      .def(
          "step",
          [](PyOptimizer& o, std::optional<double> lr) {
            const double rate = lr.value_or(o.lr);
            const py::gil_scoped_release release;
            o.optimizer->step(rate);
          },
          py::arg("lr") = py::none(), "One step with `lr` (default: the optimizer's lr).")
      .def("zero_grad", [](PyOptimizer& o) { o.model->runtime("zero_grad").zero_grad(); })
      .def_readwrite("lr", &PyOptimizer::lr)
      .def_property_readonly("steps", [](const PyOptimizer& o) { return o.optimizer->steps(); });

  module.def(
      "AdamW",
      [](const std::shared_ptr<PyModel>& model, double lr, double weight_decay,
         std::pair<double, double> betas, double eps) {
        auto slots = model->runtime("AdamW").optimizer_slots();
        return PyOptimizer{model,
                           std::make_unique<nn::AdamW>(std::move(slots), weight_decay, betas.first,
                                                       betas.second, eps),
                           lr};
      },
      py::arg("model"), py::arg("lr") = 1e-3, py::arg("weight_decay") = 0.0,
      py::arg("betas") = std::pair<double, double>{0.9, 0.999}, py::arg("eps") = 1e-8,
      "AdamW as torch.optim.AdamW, over the model's local shards.");
  module.def(
      "SGD",
      [](const std::shared_ptr<PyModel>& model, double lr, double momentum, double weight_decay) {
        auto slots = model->runtime("SGD").optimizer_slots();
        return PyOptimizer{model,
                           std::make_unique<nn::SGD>(std::move(slots), momentum, weight_decay), lr};
      },
      py::arg("model"), py::arg("lr") = 1e-3, py::arg("momentum") = 0.9,
      py::arg("weight_decay") = 0.0, "SGD with momentum as torch.optim.SGD.");

  module.def(
      "cross_entropy",
      [](const py::object& logits, const py::object& labels) {
        const Tensor input = f32_input(logits, "logits");
        const std::vector<std::uint8_t> classes = labels_from(labels);
        const nn::CrossEntropyResult result = nn::softmax_cross_entropy(input, classes);
        return py::make_tuple(array_from_tensor(result.losses),
                              array_from_tensor(result.grad_logits), result.correct);
      },
      py::arg("logits"), py::arg("labels"),
      "(losses float64 [rows], grad_logits float32 [rows, classes], correct): softmax "
      "cross-entropy row by row; the gradient is that of the *sum* of the losses.");
}

void bind_data(py::module_& module) {
  py::class_<PyDataset>(module, "Dataset", "Training and test images with their labels.")
      .def_property_readonly("train_images",
                             [](const PyDataset& d) {
                               const auto& s = d.data->train;
                               return view_bytes(d.data, s.pixels, {s.count, s.height, s.width});
                             })
      .def_property_readonly("train_labels",
                             [](const PyDataset& d) {
                               return view_bytes(d.data, d.data->train.labels,
                                                 {d.data->train.count});
                             })
      .def_property_readonly("test_images",
                             [](const PyDataset& d) {
                               const auto& s = d.data->test;
                               return view_bytes(d.data, s.pixels, {s.count, s.height, s.width});
                             })
      .def_property_readonly("test_labels",
                             [](const PyDataset& d) {
                               return view_bytes(d.data, d.data->test.labels, {d.data->test.count});
                             })
      .def(
          "limit",
          [](const PyDataset& d, std::int64_t train, const std::optional<std::int64_t>& test) {
            auto data = std::make_shared<train::Dataset>();
            data->train = first_images(d.data->train, train);
            data->test = first_images(d.data->test, test.value_or(d.data->test.count));
            return PyDataset{std::move(data)};
          },
          py::arg("train"), py::arg("test") = py::none(),
          "The first `train` training and `test` test images (a copy).")
      .def("__repr__", [](const PyDataset& d) {
        return fmt::format("Dataset(train={}, test={}, image={}x{})", d.data->train.count,
                           d.data->test.count, d.data->train.height, d.data->train.width);
      });

  module.def(
      "load_dataset",
      [](const std::string& directory) {
        auto data = std::make_shared<train::Dataset>();
        {
          const py::gil_scoped_release release;
          *data = train::load_dataset(directory);
        }
        return PyDataset{std::move(data)};
      },
      py::arg("directory") = std::string(train::kDefaultDataDir),
      "Loads an MNIST-format directory (default: Debian's dataset-fashion-mnist).");
  module.def(
      "epoch_order",
      [](std::int64_t count, std::uint64_t seed, std::int64_t epoch) {
        if (count > 0 && count <= train::kMaxEpochSamples) {  // the order and its array
          require_memory(2.0 * static_cast<double>(count) * sizeof(std::int64_t),
                         fmt::format("the epoch order of {} samples", count));
        }
        const std::vector<std::int64_t> order = train::epoch_order(count, seed, epoch);
        Tensor tensor =
            Tensor::uninitialized(Shape{static_cast<std::int64_t>(order.size())}, DType::i64);
        std::copy(order.begin(), order.end(), tensor.values<std::int64_t>().begin());
        return array_from_tensor(tensor);
      },
      py::arg("count"), py::arg("seed"), py::arg("epoch"),
      "The order of `count` training samples in epoch `epoch` (0-based) that train() uses.");
  module.def(
      "lr_at",
      [](std::int64_t step, double base, std::int64_t total_steps, std::int64_t warmup,
         const std::string& schedule) {
        nn::LrSchedule s;
        s.kind = nn::parse_schedule_kind(schedule);
        s.base = base;
        s.total_steps = total_steps;
        s.warmup_steps = warmup;
        return s.at(step);
      },
      py::arg("step"), py::arg("base"), py::arg("total_steps"), py::arg("warmup") = 0,
      py::arg("schedule") = "cosine", "The learning rate train() uses at `step` (0-based).");
  module.def("train", &run_training, py::arg("data"), py::kw_only(), py::arg("world") = py::none(),
             "Trains an MLP data-parallel on this rank's world, as `meshtensor train` does (the "
             "keywords are its flags: model='mlp:256', strategy='fsdp', mode='exact', steps=, "
             "epochs=, batch=, micro_batches=, lr=, schedule=, save=, resume=, stop_after=, ...). "
             "Collective; returns the run's figures and its weights digest.");
}

}  // namespace

void bind_train(py::module_& module) {
  bind_data(module);
  bind_models(module);
}

}  // namespace meshtensor::python
