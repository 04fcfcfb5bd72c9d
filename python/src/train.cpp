#include <cmath>

#include <fmt/format.h>

#include <meshtensor/checkpoint/checkpoint.hpp>
#include <meshtensor/core/digest.hpp>
#include <meshtensor/core/error.hpp>
#include <meshtensor/core/memory.hpp>
#include <meshtensor/fsdp/sharded_model.hpp>
#include <meshtensor/ft/replica_groups.hpp>
#include <meshtensor/generate/load.hpp>
#include <meshtensor/kernels/elementwise.hpp>
#include <meshtensor/nn/loss.hpp>
#include <meshtensor/nn/mlp.hpp>
#include <meshtensor/nn/models.hpp>
#include <meshtensor/nn/optim.hpp>
#include <meshtensor/train/dataset.hpp>
#include <meshtensor/train/model_state.hpp>
#include <meshtensor/train/result_json.hpp>
#include <meshtensor/train/settings.hpp>
#include <meshtensor/train/trainer.hpp>

#include "bindings.hpp"

namespace meshtensor::python {

namespace {

/// A loaded data set, shared by the arrays that view it.
struct PyDataset {
  std::shared_ptr<train::Dataset> data;
};

/// A model (an MLP or a GPT) and, once fully_shard / replicate ran, its runtime on a mesh.
struct PyModel {
  std::unique_ptr<nn::Module> module;
  std::vector<nn::Module*> units;  // the parameter groups fully_shard makes
  bool takes_tokens = false;       // inputs are token ids (GPT), not f32 features (MLP)
  std::string kind = "MLP";
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

/// The Python classes MLP and GPT: a PyModel built by their constructors.
struct PyMlp : PyModel {};
struct PyGpt : PyModel {};

/// A loaded text corpus.
struct PyText {
  std::shared_ptr<const train::TextCorpus> corpus;
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

/// The seq_len keyword (windows of that many tokens), or 0.
std::int64_t seq_len(const py::kwargs& kwargs) {
  if (!kwargs.contains("seq_len") || kwargs["seq_len"].is_none()) return 0;
  return kwargs["seq_len"].cast<std::int64_t>();
}

/// A language task: the decoder `model` on the tokens of `tokenizer_path` (bytes when empty), or
/// the model and tokenizer of the `init` keyword (which `model` and `tokenizer` must leave alone).
std::unique_ptr<train::Task> language_task(std::shared_ptr<const train::TextCorpus> corpus,
                                           const py::kwargs& kwargs, const std::string& model,
                                           const std::string& tokenizer_path) {
  if (kwargs.contains("init") && !kwargs["init"].is_none()) {
    const std::string init = py::str(kwargs["init"]).cast<std::string>();
    if (kwargs.contains("model") || kwargs.contains("tokenizer")) {
      throw InvalidArgument(fmt::format(
          "train: init='{}' brings its own model and tokenizer; model= and tokenizer= do not apply",
          init));
    }
    return std::make_unique<train::LanguageModelling>(
        std::move(corpus), generate::model_architecture(init), generate::model_tokenizer(init),
        seq_len(kwargs));
  }
  nn::DecoderSpec decoder = nn::parse_decoder_spec(model);
  std::shared_ptr<const tokenize::Tokenizer> tokenizer;
  if (!tokenizer_path.empty()) {
    tokenizer =
        std::make_shared<const tokenize::Tokenizer>(tokenize::Tokenizer::load(tokenizer_path));
    decoder = nn::with_vocabulary(decoder, tokenizer->vocabulary());
  }
  return std::make_unique<train::LanguageModelling>(std::move(corpus), std::move(decoder),
                                                    std::move(tokenizer), seq_len(kwargs));
}

/// The task train() runs: the model keyword (an MLP for images, "gpt..." for text; default by
/// the data) and the data.
std::unique_ptr<train::Task> task_for(const py::object& data, const py::kwargs& kwargs) {
  const bool text = py::isinstance<PyText>(data);
  if (!text && !py::isinstance<PyDataset>(data)) {
    throw ArgumentTypeError(fmt::format(
        "train(): argument 'data' must be Dataset (load_dataset) or Text (load_text), got {}",
        describe_value(data)));
  }
  std::string model = text ? "gpt" : "mlp:1024,1024";
  std::string tokenizer_path;
  nn::MlpConfig mlp;
  bool mlp_keys = false;
  for (const auto& [key, value] : kwargs) {
    const auto name = key.cast<std::string>();
    const std::string argument = fmt::format("train() argument '{}'", name);
    if (name == "model") {
      model = py::str(value).cast<std::string>();
    } else if (name == "tokenizer") {
      tokenizer_path = py::str(value).cast<std::string>();
    } else if (name == "hidden") {
      mlp.hidden = cast_argument<std::vector<std::int64_t>>(value, argument);
      mlp_keys = true;
    } else if (name == "activation") {
      mlp.activation = nn::parse_activation(py::str(value).cast<std::string>());
      mlp_keys = true;
    } else if (name == "layernorm") {
      mlp.layernorm = cast_argument<bool>(value, argument);
      mlp_keys = true;
    }
  }
  const bool gpt = nn::is_decoder_model(model);
  if (gpt != text) {
    throw InvalidArgument(fmt::format("train: model '{}' trains on {}; give {}", model,
                                      gpt ? "text" : "images",
                                      gpt ? "load_text(...)" : "load_dataset(...)"));
  }
  if (gpt) {
    if (mlp_keys) throw InvalidArgument("train: hidden, activation and layernorm shape an MLP");
    return language_task(data.cast<const PyText&>().corpus, kwargs, model, tokenizer_path);
  }
  if (!tokenizer_path.empty())
    throw InvalidArgument(
        fmt::format("train: tokenizer= tokenizes text; model '{}' reads images", model));
  if (kwargs.contains("model") && kwargs.contains("hidden")) {
    throw InvalidArgument(
        fmt::format("train: model='{}' and hidden={} both give the hidden layers; give one of them",
                    model, py::str(kwargs["hidden"]).cast<std::string>()));
  }
  if (kwargs.contains("model")) mlp.hidden = nn::parse_mlp_hidden(model);
  return std::make_unique<train::ImageClassification>(*data.cast<const PyDataset&>().data, mlp);
}

/// The keywords of train() that are neither a training setting nor read by task_for.
bool python_only_keyword(const std::string& name) {
  return name == "model" || name == "hidden" || name == "activation" || name == "layernorm" ||
         name == "on_epoch" || name == "tokenizer" || name == "replica_groups" ||
         name == "replica_group" || name == "coordinator" || name == "min_replica_groups" ||
         name == "replica_timeout" || name == "replica_host";
}

/// A fault-tolerant run's keywords, as the command line's --replica-* and --coordinator.
ft::ReplicaGroupsConfig replica_groups_config(const py::kwargs& kwargs) {
  ft::ReplicaGroupsConfig config;
  const auto get = [&]<typename T>(const char* name, T& field) {
    if (kwargs.contains(name) && !kwargs[name].is_none())
      field = cast_argument<T>(kwargs[name], fmt::format("train() argument '{}'", name));
  };
  get("replica_groups", config.groups);
  get("replica_group", config.group);
  get("coordinator", config.coordinator);
  get("min_replica_groups", config.min_groups);
  get("replica_timeout", config.timeout);
  get("replica_host", config.host);
  return config;
}

/// The training settings train()'s keyword arguments give (train::TrainSettings reads them
/// as the command line's do); InvalidArgument naming an unknown keyword.
train::TrainSettings train_settings(const py::kwargs& kwargs) {
  train::TrainSettings settings;
  for (const auto& [key, value] : kwargs) {
    const auto name = key.cast<std::string>();  // keyword names are str
    if (python_only_keyword(name)) continue;
    if (!train::TrainSettings().has_field(name))
      throw InvalidArgument(fmt::format("train: unknown option '{}'", name));
    if (value.is_none()) continue;  // save=None, resume=None: the default
    settings.set(name, setting_text(value, fmt::format("train() argument '{}'", name)));
  }
  return settings;
}

py::object run_training(const py::object& data, const py::object& world_object,
                        const py::kwargs& kwargs) {
  const std::unique_ptr<train::Task> task = task_for(data, kwargs);
  const ft::ReplicaGroupsConfig groups = replica_groups_config(kwargs);
  const train::TrainConfig config =
      ft::replica_group_defaults(train_settings(kwargs).config(py::isinstance<PyText>(data)),
                                 groups, kwargs.contains("strategy") || kwargs.contains("mesh"));
  train::TrainCallbacks callbacks;
  py::object on_epoch = kwargs.contains("on_epoch") ? py::object(kwargs["on_epoch"]) : py::none();
  if (!on_epoch.is_none()) {
    callbacks.on_epoch = [&on_epoch, &task](const train::EpochReport& report) {
      const py::gil_scoped_acquire gil;
      on_epoch(python_of(train::epoch_json(report, *task)));
    };
  }
  std::shared_ptr<comm::Communicator> world = world_or_current(world_object);
  train::TrainResult result;
  {
    const py::gil_scoped_release release;
    const auto replicas = ft::join_replica_groups(*world, groups, config, *task);
    result = train::train(*world, *task, config, callbacks, replicas.get());
  }
  nlohmann::json out = train::result_json(result, *task, config, world->size());
  for (auto& warning : out["warnings"])
    warning = with_keyword_names(warning.get<std::string>());
  return python_of(out);
}

std::shared_ptr<PyMlp> make_model(std::int64_t inputs, const std::vector<std::int64_t>& hidden,
                                  std::int64_t outputs, const std::string& activation,
                                  bool layernorm, std::uint64_t seed) {
  auto model = std::make_shared<PyMlp>();
  nn::MlpConfig config;
  config.inputs = inputs;
  config.hidden = hidden;
  config.outputs = outputs;
  config.activation = nn::parse_activation(activation);
  config.layernorm = layernorm;
  config.seed = seed;
  for (const std::int64_t size : {inputs, outputs}) {
    if (size < 1) throw InvalidArgument(fmt::format("MLP sizes must be at least 1, got {}", size));
  }
  for (const std::int64_t size : hidden) {
    if (size < 1)
      throw InvalidArgument(fmt::format("MLP hidden sizes must be at least 1, got {}", size));
  }
  auto mlp = nn::make_mlp(config);
  for (std::size_t i = 0; i < mlp->size(); ++i)
    if (!mlp->at(i).parameters().empty()) model->units.push_back(&mlp->at(i));
  model->module = std::move(mlp);
  return model;
}

std::shared_ptr<PyGpt> make_gpt(std::int64_t layers, std::int64_t heads, std::int64_t dim,
                                std::int64_t context, std::uint64_t seed) {
  nn::GptConfig config;
  config.layers = layers;
  config.heads = heads;
  config.dim = dim;
  config.context = context;
  config.seed = seed;
  // The command line's ranges and checks, through its parser.
  config = nn::parse_gpt_config(nn::gpt_config_text(config));
  config.seed = seed;
  auto model = std::make_shared<PyGpt>();
  auto gpt = std::make_unique<nn::Gpt>(config);
  model->units = gpt->units();
  model->module = std::move(gpt);
  model->takes_tokens = true;
  model->kind = "GPT";
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
  // Exact mode's GPT sums (the trainer's choice): bits independent of any tensor-parallel split.
  if (auto* decoder = dynamic_cast<nn::Decoder*>(model->module.get()))
    decoder->set_exact_sums(options.mode == comm::ReductionMode::exact);
  std::unique_ptr<fsdp::ShardedModel> sharded;
  {
    const py::gil_scoped_release release;  // making the groups is collective
    sharded = std::make_unique<fsdp::ShardedModel>(*model->module, *groups, options);
    for (nn::Module* unit : model->units)
      sharded->fully_shard(*unit, config);
  }
  model->mesh = mesh;
  model->sharded = std::move(sharded);
  return model;
}

std::vector<std::int32_t> labels_from(const py::handle& labels) {
  const Tensor tensor = tensor_from_array(labels);
  std::vector<std::int32_t> result(static_cast<std::size_t>(tensor.numel()));
  visit_dtype(tensor.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const auto values = tensor.values<T>();
    for (std::size_t i = 0; i < values.size(); ++i) {
      const double value = element_to_double(values[i]);
      if (!(value >= 0 && value < 2147483648.0 && value == std::floor(value)))
        throw InvalidArgument(fmt::format("label {} is not a class index", value));
      result[i] = static_cast<std::int32_t>(value);
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

/// The input of a model: token ids (any integer array [batch, length], as i64) for a GPT,
/// float32 [rows, features] for an MLP.
Tensor model_input(const PyModel& m, const py::object& x) {
  if (!m.takes_tokens) return f32_input(x, "input");
  const Tensor tensor = tensor_from_array(x);
  const DType dtype = tensor.dtype();
  if (tensor.rank() != 2 || !(dtype == DType::i64 || dtype == DType::i32 || dtype == DType::u8)) {
    throw InvalidArgument(
        fmt::format("GPT input must be a 2-d integer array of token ids "
                    "[batch, length], got {} of shape {}",
                    dtype_name(dtype), tensor.shape().to_string()));
  }
  return kernels::convert(tensor, DType::i64);
}

py::array model_forward(PyModel& m, const py::object& x) {
  const Tensor input = model_input(m, x);
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
      module, "Model",
      "A model with batch-invariant kernels (MLP or GPT). fully_shard / replicate put it on a "
      "mesh; then forward, backward and an optimizer train it.")
      .def("forward", &model_forward, py::arg("x"),
           "Logits of x: float32 [rows, outputs] of float32 [rows, inputs] (MLP), float32 "
           "[batch, length, vocabulary] of token ids [batch, length] (GPT).")
      .def("__call__", &model_forward, py::arg("x"))
      .def(
          "backward",
          [](PyModel& m, const py::object& grad) {
            const Tensor grad_logits = tensor_from_array(grad);
            if (grad_logits.dtype() != DType::f32) {
              throw InvalidArgument(fmt::format("grad_logits must be float32, got {}",
                                                dtype_name(grad_logits.dtype())));
            }
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
        return fmt::format("{}({}{})", m.kind, m.module->describe(),
                           m.sharded ? ", on mesh " + m.mesh->mesh.to_string() : std::string());
      });
  py::class_<PyMlp, PyModel, std::shared_ptr<PyMlp>>(
      module, "MLP",
      "inputs -> hidden... -> outputs, each hidden layer Linear (+ LayerNorm) + activation.")
      .def(py::init(&make_model), py::arg("inputs") = 784,
           py::arg("hidden") = std::vector<std::int64_t>{1024, 1024}, py::arg("outputs") = 10,
           py::kw_only(), py::arg("activation") = "relu", py::arg("layernorm") = false,
           py::arg("seed") = 0);
  const nn::GptConfig gpt_defaults;
  py::class_<PyGpt, PyModel, std::shared_ptr<PyGpt>>(
      module, "GPT",
      "A GPT-style decoder over byte tokens (vocabulary 256): token and learned position "
      "embeddings, `layers` pre-norm blocks of causal self-attention and a GELU MLP, a final "
      "LayerNorm and the language-model head, as `meshtensor train --model gpt:...` builds it. "
      "fully_shard makes the embedding, each block and the head one group each.")
      .def(py::init(&make_gpt), py::kw_only(), py::arg("layers") = gpt_defaults.layers,
           py::arg("heads") = gpt_defaults.heads, py::arg("dim") = gpt_defaults.dim,
           py::arg("context") = gpt_defaults.context, py::arg("seed") = 0);

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
      [](const py::object& logits, const py::object& labels, bool exact_sums) {
        const Tensor input = f32_input(logits, "logits");
        const std::vector<std::int32_t> classes = labels_from(labels);
        nn::CrossEntropyOptions options;
        options.exact_sums = exact_sums;
        const nn::CrossEntropyResult result = nn::softmax_cross_entropy(input, classes, options);
        return py::make_tuple(array_from_tensor(result.losses),
                              array_from_tensor(result.grad_logits), result.correct);
      },
      py::arg("logits"), py::arg("labels"), py::kw_only(), py::arg("exact_sums") = false,
      "(losses float64 [rows], grad_logits float32 [rows, classes], correct): softmax "
      "cross-entropy row by row; the gradient is that of the *sum* of the losses. exact_sums: "
      "the softmax denominators as correctly rounded sums (what `meshtensor train` uses for a "
      "GPT in exact mode).");
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
             "Trains data-parallel on this rank's world, as `meshtensor train` does: an MLP on a "
             "Dataset, a GPT on Text (the keywords are its flags: model='mlp:256' or "
             "model='gpt:layers=2,dim=64', strategy='fsdp', mode='exact', steps=, epochs=, "
             "batch=, micro_batches=, lr=, schedule=, eval_every=, save=, resume=, stop_after=, "
             "mesh=(2, 2, 2) with names=('dp', 'fsdp', 'tp') (or 'pp' for pipeline stages, "
             "with pipeline_schedule=, virtual_stages=, activation_checkpointing=), "
             "sequence_parallel=, "
             "clip_grad_norm=, ...; a GPT run has the command line's GPT defaults; a "
             "fault-tolerant run's replica group: replica_groups=, replica_group=, "
             "coordinator='HOST:PORT', min_replica_groups=, replica_timeout=, replica_host=). "
             "Collective; "
             "returns the run's "
             "figures (test_loss: on the validation text for a GPT), a generated sample for a "
             "GPT and its weights digest.");
  py::class_<PyText>(module, "Text",
                     "Text split into training and validation records, byte-level tokens.")
      .def_property_readonly("train", [](const PyText& t) { return py::bytes(t.corpus->train); })
      .def_property_readonly("validation",
                             [](const PyText& t) { return py::bytes(t.corpus->validation); })
      .def(
          "samples",
          [](const PyText& t, std::int64_t context) {
            nn::GptConfig model;
            model.context = context;
            return train::LanguageModelling(t.corpus, nn::gpt_spec(model)).samples();
          },
          py::arg("context"), "Training windows of `context` tokens in one epoch.")
      .def(
          "windows",
          [](const PyText& t, std::int64_t context, std::uint64_t seed, std::int64_t epoch,
             std::int64_t first, std::int64_t count) {
            if (context < 1 || epoch < 0 || first < 0 || count < 0) {
              throw InvalidArgument(fmt::format(
                  "windows: context {}, epoch {}, first {} and count {} must not be negative "
                  "(context at least 1)",
                  context, epoch, first, count));
            }
            // The tokens, the targets and the int64 array handed out: three copies.
            require_memory(3.0 * 8.0 * static_cast<double>(count) * static_cast<double>(context),
                           fmt::format("windows: {} windows of {} tokens", count, context));
            nn::GptConfig model;
            model.context = context;
            const train::Batch batch = train::LanguageModelling(t.corpus, nn::gpt_spec(model))
                                           .train_batch(seed, epoch, first, count);
            Tensor targets(batch.input.shape(), DType::i64);
            std::copy(batch.targets.begin(), batch.targets.end(),
                      targets.values<std::int64_t>().begin());
            return py::make_tuple(array_from_tensor(batch.input), array_from_tensor(targets));
          },
          py::arg("context"), py::arg("seed"), py::arg("epoch"), py::arg("first"), py::arg("count"),
          "(tokens, targets), int64 [count, context] each: training windows first .. first + "
          "count - 1 of `epoch` (0-based) that train() uses for `seed`; targets are the tokens "
          "shifted by one.")
      .def_property_readonly("files", [](const PyText& t) { return t.corpus->files; })
      .def_property_readonly("records", [](const PyText& t) { return t.corpus->records; })
      .def("__repr__", [](const PyText& t) {
        return fmt::format("Text(train={} bytes, validation={} bytes, files={}, records={})",
                           t.corpus->train.size(), t.corpus->validation.size(), t.corpus->files,
                           t.corpus->records);
      });
  module.def(
      "load_text",
      [](const std::string& path) {
        std::shared_ptr<const train::TextCorpus> corpus;
        {
          const py::gil_scoped_release release;
          corpus = std::make_shared<const train::TextCorpus>(train::load_text(path));
        }
        return PyText{std::move(corpus)};
      },
      py::arg("path") = std::string(train::kDefaultTextDir),
      "Loads a UTF-8 text file or a directory of them (default: Debian's fortunes), split by "
      "the rule `meshtensor train --model gpt` uses: every 20th record is validation text.");
}

}  // namespace

void bind_train(py::module_& module) {
  bind_data(module);
  bind_models(module);
}

}  // namespace meshtensor::python
