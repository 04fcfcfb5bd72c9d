#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <mutex>

#include <fmt/format.h>

#include <meshtensor/core/digest.hpp>
#include <meshtensor/core/error.hpp>
#include <meshtensor/rl/grpo.hpp>
#include <meshtensor/rl/result_json.hpp>
#include <meshtensor/rl/settings.hpp>
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

/// rl()'s keywords that are not settings: the launch (trainer ranks, the generator's layout)
/// and the callbacks.
struct RlKeywords {
  std::int64_t trainer_ranks = 0;
  std::int64_t generator_tp = 1;
  py::object generator = py::none();
  py::object reward = py::none();
  py::object on_step = py::none();
};

/// The settings of rl()'s arguments (rl::RlSettings reads them as the command line's flags) and
/// its other keywords in `own`; InvalidArgument naming an unknown keyword.
rl::RlSettings rl_settings(const py::object& init, const py::kwargs& kwargs, RlKeywords& own) {
  rl::RlSettings settings;
  if (!init.is_none()) settings.set("init", py::str(init).cast<std::string>());
  for (const auto& [key, value] : kwargs) {
    const auto name = key.cast<std::string>();
    const std::string argument = fmt::format("rl() argument '{}'", name);
    if (name == "trainer_ranks") {
      own.trainer_ranks = cast_argument<std::int64_t>(value, argument);
    } else if (name == "generator_tp") {
      own.generator_tp = cast_argument<std::int64_t>(value, argument);
    } else if (name == "generator" || name == "reward" || name == "on_step") {
      (name == "generator" ? own.generator
       : name == "reward"  ? own.reward
                           : own.on_step) = py::reinterpret_borrow<py::object>(value);
    } else if (name == "init" || !settings.has_field(name)) {
      throw InvalidArgument(fmt::format("rl: unknown option '{}'", name));
    } else if (!value.is_none()) {
      settings.set(name, setting_text(value, argument));
    }
  }
  if (own.generator_tp < 1) {
    throw InvalidArgument(
        fmt::format("rl(): generator_tp must be at least 1, got {}", own.generator_tp));
  }
  return settings;
}

py::object run_rl(const py::object& init, const py::object& world_object,
                  const py::kwargs& kwargs) {
  std::shared_ptr<comm::Communicator> world = world_or_current(world_object);
  RlKeywords own;
  const rl::RlSettings settings = rl_settings(init, kwargs, own);
  rl::RlConfig config = settings.config();
  config.trainer_ranks = own.trainer_ranks;
  config.generator = generator_from(own.generator, own.generator_tp, world->size());
  rl::RlTask task = rl::tokenized_for(settings.task(), config.init);
  if (!own.reward.is_none()) task.reward = python_reward(own.reward, world);
  rl::RlCallbacks callbacks;
  if (!own.on_step.is_none()) {
    callbacks.on_step = [&own](const rl::RlStepReport& r) {
      const py::gil_scoped_acquire gil;
      own.on_step(python_of(rl::step_json(r)));
    };
  }
  rl::RlResult result;
  {
    const py::gil_scoped_release release;
    result = rl::run_rl(*world, task, config, callbacks);
  }
  return python_of(rl::result_json(result, config));
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
