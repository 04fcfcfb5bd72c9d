#include <csignal>
#include <cstdlib>
#include <iostream>
#include <thread>
#include <unistd.h>

#include <fmt/format.h>

#include <meshtensor/checkpoint/checkpoint.hpp>
#include <meshtensor/core/error.hpp>
#include <meshtensor/generate/load.hpp>
#include <meshtensor/kernels/openblas_baseline.hpp>
#include <meshtensor/serve/server.hpp>
#include <meshtensor/serve/settings.hpp>
#include <meshtensor/tp/style.hpp>

#include "backend.hpp"
#include "commands.hpp"
#include "options.hpp"
#include "setting_options.hpp"

namespace meshtensor::cli {

namespace {

/// `meshtensor serve`'s options: the launch here, the server's settings as serve::ServeSettings
/// fields.
struct ServeCliOptions {
  std::string ranks;
  std::string mesh;
  std::string names;
  std::string backend = "threads";
  std::string api_key;
  bool batch_variant = false;
  SettingOptions settings;
};

/// The API key: --api-key, else the environment variable MESHTENSOR_API_KEY (empty: none).
/// A key no client could send in a header (a control byte, spaces at an end) is refused.
std::string api_key(const ServeCliOptions& options) {
  const char* from_environment = std::getenv("MESHTENSOR_API_KEY");
  const bool given = !options.api_key.empty();
  const std::string key = given ? options.api_key : from_environment ? from_environment : "";
  const char* source = given ? "--api-key" : "MESHTENSOR_API_KEY";
  for (std::size_t i = 0; i < key.size(); ++i) {
    const auto byte = static_cast<unsigned char>(key[i]);
    if (byte < 0x20 || byte == 0x7f) {
      throw ParseError(
          fmt::format("{}: byte {} of the key is the control character 0x{:02x}: "
                      "no request could send it in an Authorization header",
                      source, i, byte));
    }
  }
  if (!key.empty() && (key.front() == ' ' || key.back() == ' ')) {
    throw ParseError(
        fmt::format("{}: the key starts or ends with a space, which HTTP drops "
                    "from a header: no request could match it",
                    source));
  }
  return key;
}

serve::ServeConfig serve_config(const ServeCliOptions& options) {
  serve::ServeSettings settings;
  options.settings.apply_to(settings);
  serve::ServeConfig config = settings.config();
  config.api_key = api_key(options);
  if (options.batch_variant) config.batch_variant = kernels::openblas_linear_matmul();
  return config;
}

/// Turns SIGTERM and SIGINT into a drain and SIGHUP into a reload, on a thread of its own: the
/// signals are blocked in every thread started after it (the ranks, the HTTP threads) and taken
/// with sigtimedwait here. A second SIGTERM or SIGINT exits at once.
class SignalWatcher {
 public:
  explicit SignalWatcher(serve::ServeControl& control) : control_(control) {
    sigemptyset(&signals_);
    for (const int signal : {SIGTERM, SIGINT, SIGHUP})
      sigaddset(&signals_, signal);
    pthread_sigmask(SIG_BLOCK, &signals_, nullptr);
    thread_ = std::thread([this] { watch(); });
  }
  ~SignalWatcher() {
    stop_ = true;
    thread_.join();
  }
  SignalWatcher(const SignalWatcher&) = delete;
  SignalWatcher& operator=(const SignalWatcher&) = delete;

 private:
  void watch() {
    const timespec tick{0, 200'000'000};
    bool draining = false;
    while (!stop_) {
      const int signal = sigtimedwait(&signals_, nullptr, &tick);
      if (signal == SIGHUP) {
        std::cerr << "meshtensor serve: SIGHUP: reloading the checkpoint\n";
        control_.reload();
      } else if ((signal == SIGTERM || signal == SIGINT) && draining) {
        std::cerr << "meshtensor serve: second signal: exiting without draining\n";
        std::_Exit(1);
      } else if (signal == SIGTERM || signal == SIGINT) {
        std::cerr << "meshtensor serve: draining: finishing the accepted requests\n";
        draining = true;
        control_.drain();
      }
    }
  }

  serve::ServeControl& control_;
  sigset_t signals_{};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

void run_serve(const ServeCliOptions& options) {
  serve::ServeConfig base = serve_config(options);
  const Backend backend = parse_backend(options.backend);
  const std::int64_t given =
      tensor_parallel_option(options.ranks, options.mesh, options.names, "serve");
  // The checkpoint and the layout are checked before any rank starts.
  const nn::DecoderSpec model = generate::model_architecture(base.checkpoint);
  if (given > 1) tp::check_decoder_degree(model, given);
  // The default id names the model's family: meshtensor-gpt, meshtensor-llama.
  if (!options.settings.given("model_name"))
    base.model_name = "meshtensor-" + nn::decoder_family_name(model);
  serve::ServeControl control;
  const SignalWatcher signals(control);
  run_ranks(backend, std::max<std::int64_t>(given, 1), "serve", [&](comm::Communicator& world) {
    if (backend == Backend::mpi && given > 0 && world.size() != given) {
      throw InvalidArgument(fmt::format("--{} {} does not match the mpi job's {} ranks",
                                        options.ranks.empty() ? "mesh" : "ranks", given,
                                        world.size()));
    }
    serve::ServeConfig config = base;
    config.on_listening = [&](const std::string& url) {
      std::cout << fmt::format(
                       "meshtensor serve: listening on {} (model {}: {}, {} mode, {} rank{}; "
                       "pid {})",
                       url, config.model_name, nn::decoder_spec_text(model),
                       comm::reduction_mode_name(config.mode), world.size(),
                       world.size() == 1 ? "" : "s", getpid())
                << std::endl;
    };
    serve::serve(world, config, &control);
    if (world.rank() == 0) std::cout << "meshtensor serve: drained, exiting" << std::endl;
  });
}

}  // namespace

void add_serve_command(CLI::App& app) {
  auto options = std::make_shared<ServeCliOptions>();
  CLI::App* command = app.add_subcommand(
      "serve",
      "Serve a GPT checkpoint over an OpenAI-compatible HTTP API (POST /v1/completions and "
      "/v1/chat/completions, GET /v1/models, /health, /metrics): continuous batching, and the same "
      "bits for a request "
      "under any load");
  options->settings.add_to(*command, serve::ServeSettings::table(),
                           {"checkpoint", "host", "port", "mode"});
  options->settings.option("checkpoint")->required();
  command->add_option("--ranks", options->ranks,
                      "ranks serving together, the model split over them by tensor parallelism");
  command->add_option("--mesh", options->mesh, "the tensor-parallel degree, with --names tp");
  command->add_option("--names", options->names, "tp (the only dim serving takes)");
  command->add_option("--backend", options->backend, "threads (default) or mpi (under mpirun)");
  options->settings.add_to(
      *command, serve::ServeSettings::table(),
      {"max_batch", "max_queue", "prefill_chunk", "max_context", "max_body_bytes"});
  command->add_option("--api-key", options->api_key,
                      "require 'Authorization: Bearer KEY' on /v1 and /admin (default: the "
                      "environment variable MESHTENSOR_API_KEY, else none)");
  options->settings.add_to(
      *command, serve::ServeSettings::table(),
      {"model_name", "chat_template", "stream_interval_ms", "max_connections"});
  add_flag(*command, "--batch-variant", options->batch_variant,
           "run the batch-variant fast path (OpenBLAS sgemm in every Linear), giving up "
           "batch invariance: for comparisons only");
  command->callback([options] { run_serve(*options); });
}

}  // namespace meshtensor::cli
