#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>

#include <meshtensor/comm/communicator.hpp>
#include <meshtensor/nn/layers.hpp>
#include <meshtensor/serve/api.hpp>

namespace meshtensor::serve {

class Scheduler;

/// How `meshtensor serve` runs.
struct ServeConfig {
  std::string checkpoint;  ///< a checkpoint directory, or a root whose LATEST names one
  std::string host = "127.0.0.1";
  int port = 8000;  ///< 0: any free port (on_listening says which)
  comm::ReductionMode mode = comm::ReductionMode::ordered;
  std::int64_t max_batch = 16;      ///< choices generated together
  std::int64_t max_queue = 256;     ///< choices waiting; more: 429
  std::int64_t prefill_chunk = 64;  ///< prompt tokens a choice feeds per step
  /// Positions a choice may use (its prompt and new tokens), cache reserved for each of
  /// max_batch choices at start (0: the model's context; more than it is refused).
  std::int64_t max_context = 0;
  std::string api_key;  ///< empty: no key asked for
  std::string model_name = "meshtensor-gpt";
  /// A chat template (Jinja source) used instead of the model's own (empty: the model's), and
  /// what to call it in errors (its file).
  std::string chat_template;
  std::string chat_template_origin;
  ApiLimits limits;
  std::int64_t http_threads = 0;        ///< threads of the HTTP event loop (0: 2)
  std::int64_t max_connections = 4096;  ///< open at once; more are answered 503 and closed
  /// One request's headers and body must arrive within this; a slower client is disconnected.
  std::chrono::milliseconds request_timeout{30000};
  /// A kept-alive connection with no request for this long is closed.
  std::chrono::milliseconds idle_timeout{60000};
  /// A stream writes at most once per interval after its first write, carrying every token
  /// that arrived meanwhile (0: a write per step). Fewer, larger writes cost the machine less;
  /// 10 ms is below what a reader notices.
  std::int64_t stream_interval_ms = 10;
  /// When set, every Linear of the served model runs this batch-variant matmul (the fast path
  /// that gives up batch invariance; for comparison in benchmarks only).
  nn::MatmulOverride batch_variant;
  /// Called on world rank 0 once the port is bound, with the server's base URL.
  std::function<void(const std::string& url)> on_listening;
  /// How long a drain waits for the last responses to be read before closing.
  std::chrono::seconds drain_timeout{30};
};

/// Lets another thread (a signal handler's) drain or reload a running server; requests made
/// before the server is up take effect when it is.
class ServeControl {
 public:
  /// Stop taking requests, finish the queued and running ones, then return from serve().
  void drain();
  /// Load the served checkpoint again (e.g. a newer LATEST) without dropping requests.
  void reload();

 private:
  friend void serve(comm::Communicator& world, const ServeConfig& config, ServeControl* control);
  void attach(Scheduler* scheduler);
  std::mutex mutex_;
  Scheduler* scheduler_ = nullptr;
  bool drain_pending_ = false;
  bool reload_pending_ = false;
};

/// Serves the GPT of `config.checkpoint` over an OpenAI-compatible HTTP API (collective over
/// `world`, whose ranks split the model by tensor parallelism). World rank 0 runs the HTTP
/// server, whose threads only parse, validate and queue requests; every rank runs one
/// generation loop with continuous batching, rank 0 deciding each step's requests. Returns
/// after a drain (ServeControl::drain) once every accepted request has been answered.
/// Throws (on every rank) when the checkpoint cannot be served or the port cannot be bound.
void serve(comm::Communicator& world, const ServeConfig& config, ServeControl* control);

}  // namespace meshtensor::serve
