#include <chrono>
#include <cmath>
#include <condition_variable>
#include <mutex>

#include <fmt/format.h>

#include <meshtensor/core/digest.hpp>
#include <meshtensor/core/error.hpp>
#include <meshtensor/rl/grpo.hpp>
#include <meshtensor/train/text_data.hpp>

#include "bindings.hpp"

namespace meshtensor::python {

namespace {

/// `bytes` as a Python str, losslessly: UTF-8, with each byte that is not part of a valid
/// character as a lone surrogate U+DC80..U+DCFF (Python's 'surrogateescape' error handler), so
/// `text.encode("utf-8", "surrogateescape")` gives the bytes back.
py::str exact_text(const std::string& bytes) {
  PyObject* text =
      PyUnicode_DecodeUTF8(bytes.data(), static_cast<Py_ssize_t>(bytes.size()), "surrogateescape");
  if (text == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::str>(text);
}

/// One reward call's outcome, written by the Python thread that ran it.
struct RewardCall {
  std::mutex mutex;
  std::condition_variable finished;
  bool done = false;
  double value = 0;
  std::string error;
};

/// Calls `reward` (GIL held) and records the number it returned, or why there is none.
void score(const py::object& reward, const py::str& prompt, const py::str& completion,
           RewardCall& call) {
  double value = 0;
  std::string error;
  try {
    const py::object result = reward(prompt, completion);
    if (py::isinstance<py::bool_>(result) ||
        !(py::isinstance<py::float_>(result) || py::isinstance<py::int_>(result))) {
      error = fmt::format("the reward callback returned {}, not a number", describe_value(result));
    } else {
      value = result.cast<double>();
    }
  } catch (py::error_already_set& e) {
    const std::string kind = py::str(e.type().attr("__name__"));
    const std::string message = py::str(e.value());
    error = fmt::format("the reward callback raised {}: {}", kind, message);
  }
  {
    const std::lock_guard lock(call.mutex);
    call.value = value;
    call.error = std::move(error);
    call.done = true;
  }
  call.finished.notify_all();
}

/// A Python reward callback as a RewardFunction. The callback sees the prompt and completion
/// as their exact bytes (exact_text) and runs on a daemon Python thread of its own while the
/// rank waits for it without the GIL, checking the world: a run interrupted (Ctrl-C, another
/// rank's failure) stops at once even while a callback blocks, which is left to finish alone.
rl::RewardFunction python_reward(const py::object& reward,
                                 std::shared_ptr<comm::Communicator> world) {
  if (!PyCallable_Check(reward.ptr())) {
    throw ArgumentTypeError(
        fmt::format("rl(): argument 'reward' must be a callable "
                    "fn(prompt, completion) -> float, got {}",
                    describe_value(reward)));
  }
  auto kept = std::make_shared<py::object>(reward);
  return [kept, world](const std::string& prompt, const std::string& completion) -> double {
    auto call = std::make_shared<RewardCall>();
    {
      const py::gil_scoped_acquire gil;
      const py::cpp_function target([kept, call, p = exact_text(prompt),
                                     c = exact_text(completion)] { score(*kept, p, c, *call); });
      py::module_::import("threading")
          .attr("Thread")(py::arg("target") = target, py::arg("daemon") = true,
                          py::arg("name") = "meshtensor-reward")
          .attr("start")();
    }
    std::unique_lock lock(call->mutex);
    while (
        !call->finished.wait_for(lock, std::chrono::milliseconds(20), [&] { return call->done; })) {
      lock.unlock();
      world->throw_if_aborted();
      lock.lock();
    }
    if (!call->error.empty()) throw DataError(call->error);
    return call->value;
  };
}

py::list samples_list(const std::vector<rl::RlSample>& samples) {
  py::list out;
  for (const rl::RlSample& s : samples) {
    py::dict d;
    d["prompt"] = train::printable_text(s.prompt);
    d["completion"] = train::printable_text(s.completion);
    d["reward"] = s.reward;
    out.append(d);
  }
  return out;
}

py::dict rl_result_dict(const rl::RlResult& result) {
  py::dict out;
  py::list reward_mean;
  py::list kl_mean;
  py::list sync_seconds;
  py::list generate_seconds;
  py::list train_seconds;
  py::list steps;
  for (const rl::RlStepReport& r : result.steps) {
    reward_mean.append(r.reward_mean);
    kl_mean.append(r.kl_mean);
    sync_seconds.append(r.sync_seconds);
    generate_seconds.append(r.generate_seconds);
    train_seconds.append(r.train_seconds);
    py::dict step;
    step["step"] = r.step;
    step["reward_mean"] = r.reward_mean;
    step["tokens"] = r.tokens;
    step["identical"] = r.identical;
    step["max_abs_diff"] = r.max_abs_diff;
    step["kl_mean"] = r.kl_mean;
    step["loss"] = r.loss;
    step["sync_collectives"] = r.sync.collectives;
    step["sync_bytes_per_rank"] = r.sync.bytes_per_rank;
    steps.append(step);
  }
  out["weights_digest"] = digest_hex(result.weights_digest);
  out["steps"] = result.resumed_step + static_cast<std::int64_t>(result.steps.size());
  out["resumed_step"] = result.resumed_step;
  out["reward_mean"] = reward_mean;
  out["kl_mean"] = kl_mean;
  py::dict parity;
  parity["tokens"] = result.tokens;
  parity["identical"] = result.identical;
  parity["max_abs_diff"] = result.max_abs_diff;
  out["parity"] = parity;
  out["sync_seconds"] = sync_seconds;
  out["generate_seconds"] = generate_seconds;
  out["train_seconds"] = train_seconds;
  out["step_reports"] = steps;
  out["samples_before"] = samples_list(result.before);
  out["samples_after"] = samples_list(result.after);
  out["trainer_layout"] = result.trainer_layout;
  out["generator_layout"] = result.generator_layout;
  out["checkpoints"] = result.checkpoints;
  out["parameters"] = result.parameters;
  out["parameter_tensors"] = result.parameter_tensors;
  out["seconds"] = result.seconds;
  return out;
}

/// (replicas, tp) from generator=(R, T) or generator_tp=T (replicas fill the world).
rl::GeneratorLayout generator_from(const py::object& value, std::int64_t tp,
                                   std::int64_t world_ranks) {
  if (value.is_none()) return {std::max<std::int64_t>(1, world_ranks / tp), tp};
  const std::vector<std::int64_t> sizes =
      cast_argument<std::vector<std::int64_t>>(value, "rl() argument 'generator'");
  if (sizes.size() != 2) {
    throw InvalidArgument(
        fmt::format("rl(): generator= is (replicas, tp), got {} value(s)", sizes.size()));
  }
  return {sizes[0], sizes[1]};
}

py::dict run_rl(const py::object& init, const py::object& world_object, const py::kwargs& kwargs) {
  std::shared_ptr<comm::Communicator> world = world_or_current(world_object);
  rl::RlConfig config;
  config.train.mode = comm::ReductionMode::exact;
  config.train.schedule.base = 3e-4;
  config.train.clip_grad_norm = 1.0;
  config.kl = 0.05;
  config.init = init.is_none() ? "" : py::str(init).cast<std::string>();
  std::string task_name = "words";
  std::string data = train::kDefaultTextDir;
  std::string dictionary = rl::kDefaultDictionary;
  std::int64_t prompt_bytes = 16;
  std::string model = "gpt";
  std::string mesh_shape;
  std::string mesh_names;
  std::int64_t generator_tp = 1;
  py::object generator = py::none();
  py::object reward = py::none();
  py::object on_step = py::none();
  for (const auto& [key, value] : kwargs) {
    const auto name = key.cast<std::string>();
    const std::string argument = fmt::format("rl() argument '{}'", name);
    const auto text = [&] { return cast_argument<std::string>(value, argument); };
    const auto integer = [&] { return cast_argument<std::int64_t>(value, argument); };
    const auto real = [&] { return cast_argument<double>(value, argument); };
    if (name == "task")
      task_name = text();
    else if (name == "data")
      data = text();
    else if (name == "dictionary")
      dictionary = text();
    else if (name == "prompt_bytes")
      prompt_bytes = integer();
    else if (name == "model")
      model = text();
    else if (name == "steps")
      config.steps = integer();
    else if (name == "prompts")
      config.prompts = integer();
    else if (name == "samples")
      config.samples = integer();
    else if (name == "new_tokens")
      config.new_tokens = integer();
    else if (name == "temperature")
      config.temperature = real();
    else if (name == "top_k")
      config.top_k = integer();
    else if (name == "clip_ratio")
      config.clip_ratio = real();
    else if (name == "kl")
      config.kl = real();
    else if (name == "ppo_epochs")
      config.ppo_epochs = integer();
    else if (name == "minibatches")
      config.minibatches = integer();
    else if (name == "max_batch")
      config.max_batch = integer();
    else if (name == "lr")
      config.train.schedule.base = real();
    else if (name == "warmup")
      config.train.schedule.warmup_steps = integer();
    else if (name == "schedule")
      config.train.schedule.kind = nn::parse_schedule_kind(text());
    else if (name == "optimizer")
      config.train.optimizer = train::parse_optimizer(text());
    else if (name == "weight_decay")
      config.train.weight_decay = real();
    else if (name == "clip_grad_norm")
      config.train.clip_grad_norm = real();
    else if (name == "micro_batches")
      config.train.micro_batches = integer();
    else if (name == "mode")
      config.train.mode = mode_from(text());
    else if (name == "seed")
      config.train.seed = cast_argument<std::uint64_t>(value, argument);
    else if (name == "strategy")
      config.train.strategy = train::parse_strategy(text());
    else if (name == "trainer_ranks")
      config.trainer_ranks = integer();
    else if (name == "mesh")
      mesh_shape = text();
    else if (name == "names")
      mesh_names = text();
    else if (name == "sequence_parallel")
      config.train.sequence_parallel = cast_argument<bool>(value, argument);
    else if (name == "generator")
      generator = py::reinterpret_borrow<py::object>(value);
    else if (name == "generator_tp")
      generator_tp = integer();
    else if (name == "save")
      config.train.save_dir = value.is_none() ? "" : text();
    else if (name == "save_every")
      config.train.save_every = integer();
    else if (name == "keep_checkpoints")
      config.train.keep_checkpoints = cast_argument<int>(value, argument);
    else if (name == "resume")
      config.train.resume_dir = value.is_none() ? "" : text();
    else if (name == "stop_after")
      config.train.stop_after = integer();
    else if (name == "reward")
      reward = py::reinterpret_borrow<py::object>(value);
    else if (name == "on_step")
      on_step = py::reinterpret_borrow<py::object>(value);
    else
      throw InvalidArgument(fmt::format("rl: unknown option '{}'", name));
  }
  if (config.train.mode == comm::ReductionMode::native)
    throw InvalidArgument("rl(): mode='native': RL runs in 'exact' (default) or 'ordered' mode");
  if (generator_tp < 1)
    throw InvalidArgument(
        fmt::format("rl(): generator_tp must be at least 1, got {}", generator_tp));
  if (!mesh_names.empty())
    config.train.mesh = train::parse_named_mesh(mesh_shape, mesh_names);
  else if (!mesh_shape.empty())
    throw InvalidArgument(
        fmt::format("rl: mesh={} needs names= (dims dp, fsdp and tp)", mesh_shape));
  config.generator = generator_from(generator, generator_tp, world->size());
  if (config.init.empty()) config.model = nn::parse_gpt_config(model);
  rl::RlTask task = rl::builtin_task(task_name, data, dictionary, prompt_bytes);
  if (!reward.is_none()) task.reward = python_reward(reward, world);
  rl::RlCallbacks callbacks;
  if (!on_step.is_none()) {
    callbacks.on_step = [&on_step](const rl::RlStepReport& r) {
      const py::gil_scoped_acquire gil;
      py::dict step;
      step["step"] = r.step;
      step["reward_mean"] = r.reward_mean;
      step["tokens"] = r.tokens;
      step["identical"] = r.identical;
      step["kl_mean"] = r.kl_mean;
      on_step(step);
    };
  }
  rl::RlResult result;
  {
    const py::gil_scoped_release release;
    result = rl::run_rl(*world, task, config, callbacks);
  }
  return rl_result_dict(result);
}

}  // namespace

void bind_rl(py::module_& module) {
  module.def("rl", &run_rl, py::arg("init") = py::none(), py::kw_only(),
             py::arg("world") = py::none(),
             "GRPO on a GPT as `meshtensor rl` runs it, on the calling world (call it on every "
             "rank): init= a checkpoint to start from (or model='gpt:...' for fresh weights), "
             "task='words' or 'arithmetic', reward=fn(prompt, completion) -> float to score "
             "instead (called on rank 0 with the exact bytes as str decoded with "
             "'surrogateescape'; its numbers reach every rank), the trainer's layout "
             "(strategy=, trainer_ranks=, mesh= with names=, sequence_parallel=) and the "
             "generator's (generator=(replicas, tp) or generator_tp=), steps=, prompts=, "
             "samples=, new_tokens=, kl=, ppo_epochs=, minibatches=, lr=, mode='exact', seed=, "
             "save=, resume=, on_step=fn(dict). Returns a dict with weights_digest, reward_mean "
             "(per step), parity (tokens, identical, max_abs_diff) and timings.");
}

}  // namespace meshtensor::python
