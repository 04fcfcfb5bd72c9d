#include "http_frontend.hpp"

#include <cerrno>
#include <cstring>
#include <ctime>
#include <deque>
#include <httplib.h>
#include <optional>
#include <pthread.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include <fmt/format.h>

#include <meshtensor/core/error.hpp>

namespace meshtensor::serve {

namespace {

constexpr auto kWriterWait = std::chrono::milliseconds(100);

/// The HTTP threads: cpp-httplib's pool, but each thread runs at a lower scheduling priority
/// (nice +5) than the generation loop, so that parsing and writing never delay a decode step on
/// a busy machine (the tokens they would write simply go out together).
class LowPriorityPool : public httplib::TaskQueue {
 public:
  explicit LowPriorityPool(std::size_t threads) {
    for (std::size_t i = 0; i < threads; ++i)
      threads_.emplace_back([this] { work(); });
  }
  ~LowPriorityPool() override {
    shutdown();
    for (std::thread& t : threads_)
      if (t.joinable()) t.join();
  }
  void enqueue(std::function<void()> task) override {
    {
      const std::lock_guard lock(mutex_);
      tasks_.push_back(std::move(task));
    }
    ready_.notify_one();
  }
  void shutdown() override {
    {
      const std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    ready_.notify_all();
  }

 private:
  void work() {
    // Linux keeps a nice value per thread; failing to set it only costs speed.
    (void)setpriority(PRIO_PROCESS, 0, 5);
    (void)pthread_setname_np(pthread_self(), "meshtensor-http");
    for (;;) {
      std::function<void()> task;
      {
        std::unique_lock lock(mutex_);
        ready_.wait(lock, [&] { return stopping_ || !tasks_.empty(); });
        if (tasks_.empty()) return;
        task = std::move(tasks_.front());
        tasks_.pop_front();
      }
      task();
    }
  }

  std::vector<std::thread> threads_;
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<std::function<void()>> tasks_;
  bool stopping_ = false;
};

/// cpp-httplib listens with a backlog of 5 connections: clients connecting at once beyond that
/// wait for a SYN retry or fail. Listening again on the bound socket raises it.
class WideBacklogServer : public httplib::Server {
 public:
  void widen_backlog() {
    if (::listen(svr_sock_, SOMAXCONN) != 0) {
      throw InvalidArgument(
          fmt::format("cannot widen the listen backlog: {}", std::strerror(errno)));
    }
  }
};

void send_error(httplib::Response& response, const ApiError& error) {
  response.status = error.status;
  response.set_content(dump(error_body(error)), "application/json");
}

/// A bounded, printable excerpt of a path for messages.
std::string shown_path(const std::string& path) {
  std::string shown;
  for (const char c : path.substr(0, 80))
    shown += (c >= 0x20 && c < 0x7f) ? c : '?';
  return path.size() > 80 ? shown + "..." : shown;
}

/// The endpoint a request is counted under (unknown paths share one label).
std::string endpoint_label(const std::string& path) {
  for (const char* known : {"/v1/completions", "/v1/chat/completions", "/v1/models", "/health",
                            "/metrics", "/admin/reload"}) {
    if (path == known) return known;
  }
  if (path.rfind("/v1/models/", 0) == 0) return "/v1/models/{id}";
  return "other";
}

/// Where each known path is served, for 405 answers.
const char* method_of(const std::string& path) {
  if (path == "/v1/completions" || path == "/v1/chat/completions" || path == "/admin/reload")
    return "POST";
  if (path == "/v1/models" || path == "/health" || path == "/metrics" ||
      path.rfind("/v1/models/", 0) == 0) {
    return "GET";
  }
  return nullptr;
}

bool same_secret(const std::string& given, const std::string& expected) {
  // Compares every byte whatever differs first, so timing does not tell how much matched.
  unsigned char differ = given.size() == expected.size() ? 0 : 1;
  for (std::size_t i = 0; i < given.size(); ++i)
    differ |= static_cast<unsigned char>(given[i] ^
                                         expected[i % std::max<std::size_t>(expected.size(), 1)]);
  return differ == 0;
}

}  // namespace

HttpFrontend::HttpFrontend(const ServeConfig& config, Scheduler& scheduler, Metrics& metrics,
                           ServedModel model)
    : config_(config),
      scheduler_(scheduler),
      metrics_(metrics),
      model_(std::move(model)),
      random_(std::random_device{}()),
      server_(std::make_unique<WideBacklogServer>()) {
  add_routes();
}

HttpFrontend::~HttpFrontend() {
  if (listener_.joinable()) {
    server_->stop();
    listener_.join();
  }
}

void HttpFrontend::add_routes() {
  httplib::Server& s = *server_;
  const std::int64_t threads =
      config_.http_threads > 0
          ? config_.http_threads
          : std::min<std::int64_t>(1024, config_.max_queue + config_.max_batch + 16);
  s.new_task_queue = [threads] { return new LowPriorityPool(static_cast<std::size_t>(threads)); };
  s.set_payload_max_length(static_cast<std::size_t>(config_.limits.max_body_bytes));
  s.set_keep_alive_max_count(1000);
  s.set_read_timeout(10, 0);
  s.set_write_timeout(30, 0);
  s.set_tcp_nodelay(true);
  // cpp-httplib's default adds SO_REUSEPORT, which would let a second server share the port
  // silently; SO_REUSEADDR alone still allows a quick restart.
  s.set_socket_options([](socket_t sock) {
    const int yes = 1;
    (void)setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  // Runs before the library reads a body.
  s.set_pre_routing_handler([this](const httplib::Request& request, httplib::Response& response) {
    return authorized(request, response) && length_given(request, response)
               ? httplib::Server::HandlerResponse::Unhandled
               : httplib::Server::HandlerResponse::Handled;
  });
  s.Get("/health", [this](const httplib::Request&, httplib::Response& response) {
    const bool draining = scheduler_.draining();
    response.status = draining ? 503 : 200;
    response.set_content(draining ? R"({"status":"draining"})" : R"({"status":"ok"})",
                         "application/json");
  });
  s.Get("/metrics", [this](const httplib::Request&, httplib::Response& response) {
    response.set_content(metrics_.prometheus_text(), "text/plain; version=0.0.4");
  });
  s.Get("/v1/models", [this](const httplib::Request&, httplib::Response& response) {
    Json out;
    out["object"] = "list";
    out["data"] = Json::array({model_object()});
    response.set_content(dump(out), "application/json");
  });
  s.Get(R"(/v1/models/(.+))", [this](const httplib::Request& request, httplib::Response& response) {
    const std::string id = request.matches[1];
    if (id != config_.model_name) {
      return send_error(response,
                        {404,
                         fmt::format("The model '{}' does not exist: this server serves '{}'",
                                     shown_path(id), config_.model_name),
                         "invalid_request_error", "model", "model_not_found"});
    }
    response.set_content(dump(model_object()), "application/json");
  });
  s.Post("/v1/completions", [this](const httplib::Request& request, httplib::Response& response) {
    completions(request, response);
  });
  s.Post("/v1/chat/completions", [](const httplib::Request&, httplib::Response& response) {
    send_error(response, {404,
                          "/v1/chat/completions is not served: the model is a byte-level GPT that "
                          "was not tuned for chat; use /v1/completions",
                          "invalid_request_error", "", "unsupported_endpoint"});
  });
  s.Post("/admin/reload",
         [this](const httplib::Request&, httplib::Response& response) { admin_reload(response); });
  s.set_error_handler(httplib::Server::HandlerWithResponse([](const httplib::Request& request,
                                                              httplib::Response& response) {
    if (!response.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    ApiError error{response.status, "", "invalid_request_error", "", ""};
    if (response.status == 413) {
      error.message = "The request body is larger than the server accepts";
    } else if (response.status == 404 && method_of(request.path) != nullptr) {
      error.status = 405;
      error.message = fmt::format("{} is not allowed on {}: use {}", shown_path(request.method),
                                  request.path, method_of(request.path));
    } else if (response.status == 404) {
      error.message = fmt::format(
          "No endpoint {} {}: the server has POST /v1/completions, GET /v1/models, GET "
          "/health, GET /metrics and POST /admin/reload",
          shown_path(request.method), shown_path(request.path));
    } else if (response.status == 400) {
      error.message = "The request could not be read as HTTP (a malformed request line or header)";
    } else {
      error.message = fmt::format("The request could not be served (HTTP {})", response.status);
    }
    send_error(response, error);
    return httplib::Server::HandlerResponse::Handled;
  }));
  s.set_exception_handler(
      [](const httplib::Request&, httplib::Response& response, std::exception_ptr failure) {
        std::string what = "unknown error";
        try {
          std::rethrow_exception(failure);
        } catch (const std::exception& e) {
          what = e.what();
        } catch (...) {
        }
        send_error(response, {500, "Internal error: " + what, "server_error", "", ""});
      });
  s.set_logger([this](const httplib::Request& request, const httplib::Response& response) {
    metrics_.count_request(endpoint_label(request.path), response.status);
  });
}

bool HttpFrontend::length_given(const httplib::Request& request, httplib::Response& response) {
  // The library checks a Content-Length against the limit before reading a byte, but would
  // gather a chunked body whole before checking it: a body must say its length.
  if (request.method != "POST" || request.has_header("Content-Length")) return true;
  send_error(response, {411,
                        "A POST needs a Content-Length header: bodies are checked against the "
                        "limit before they are read (send an empty body with curl -d '')",
                        "invalid_request_error", "", ""});
  return false;
}

bool HttpFrontend::authorized(const httplib::Request& request, httplib::Response& response) const {
  if (config_.api_key.empty()) return true;
  if (request.path.rfind("/v1/", 0) != 0 && request.path.rfind("/admin/", 0) != 0) return true;
  const std::string header = request.get_header_value("Authorization");
  const std::string prefix = "Bearer ";
  if (header.empty()) {
    send_error(response, {401, "You didn't provide an API key: send 'Authorization: Bearer KEY'",
                          "invalid_request_error", "", "invalid_api_key"});
    return false;
  }
  if (header.rfind(prefix, 0) != 0 || !same_secret(header.substr(prefix.size()), config_.api_key)) {
    send_error(response,
               {401, "Incorrect API key provided", "invalid_request_error", "", "invalid_api_key"});
    return false;
  }
  return true;
}

Json HttpFrontend::model_object() const {
  const std::lock_guard lock(mutex_);
  Json model;
  model["id"] = config_.model_name;
  model["object"] = "model";
  model["created"] = 0;
  model["owned_by"] = "meshtensor";
  model["architecture"] = nn::gpt_config_text(model_.config);
  model["context"] = model_.config.context;
  model["checkpoint"] = model_.directory;
  model["weights_step"] = scheduler_.weights_step();
  model["mode"] = std::string(comm::reduction_mode_name(config_.mode));
  return model;
}

void HttpFrontend::set_model(const ServedModel& model) {
  const std::lock_guard lock(mutex_);
  model_ = model;
}

void HttpFrontend::completions(const httplib::Request& request, httplib::Response& response) {
  auto job = std::make_shared<Job>();
  nn::GptConfig config;
  std::uint64_t seed = 0;
  {
    const std::lock_guard lock(mutex_);
    config = model_.config;
    seed = random_();
    job->header.id = fmt::format("cmpl-{:016x}", random_());
  }
  try {
    job->params =
        parse_completion_request(request.body, config_.model_name, config, config_.limits, seed);
    job->header.created = static_cast<std::int64_t>(std::time(nullptr));
    job->header.model = config_.model_name;
    job->header.seed = job->params.sampling.seed;
    scheduler_.submit(job);
  } catch (const ApiError& error) {
    send_error(response, error);
    if (error.status == 429) response.set_header("Retry-After", "1");
    return;
  }
  {
    const std::lock_guard lock(mutex_);
    ++active_responses_;
  }
  if (job->params.stream) {
    stream_job(job, response);
  } else {
    wait_job(job, response);
  }
}

namespace {

/// What a stream has sent of each choice.
struct StreamState {
  std::optional<Clock::time_point> last_write;
  std::optional<ChunkWriter> writer;  ///< once the job's weights are known
  std::uint64_t seen = ~std::uint64_t{0};
  std::vector<std::size_t> sent;
  std::vector<bool> started;
  std::vector<bool> closed;
  bool done = false;
};

std::string event(const Json& value) {
  return "data: " + dump(value) + "\n\n";
}

/// The events a stream sends now: each choice's new text, its end, then usage and [DONE].
std::string stream_events(const Job& job, StreamState& state, bool& finished) {
  if (!job.error.empty()) {
    finished = true;
    return event(error_body({500, job.error, "server_error", "", ""})) + "data: [DONE]\n\n";
  }
  if (!job.admitted) return {};
  if (!state.writer) state.writer.emplace(job.header);
  const CompletionParams& params = job.params;
  const std::size_t count = job.choices.size();
  state.sent.resize(count, 0);
  state.started.resize(count, false);
  state.closed.resize(count, false);
  std::string out;
  for (std::size_t c = 0; c < count; ++c) {
    const ChoiceResult& choice = job.choices[c];
    if (state.closed[c]) continue;
    const bool ended = !choice.finish_reason.empty();
    const std::size_t to =
        ended ? choice.tokens.size() : streamable_tokens(choice.tokens, params.stop);
    const bool with_prompt = params.echo && !state.started[c];
    if (to <= state.sent[c] && !with_prompt && !ended) continue;
    out += event(
        completion_chunk(job.header, params, c, choice, state.sent[c], to, with_prompt, ended));
    state.sent[c] = to;
    state.started[c] = true;
    state.closed[c] = ended;
  }
  if (job.unfinished == 0) {
    if (params.include_usage) {
      Json last;
      last["id"] = job.header.id;
      last["object"] = "text_completion";
      last["created"] = job.header.created;
      last["model"] = job.header.model;
      last["choices"] = Json::array();
      last["usage"] = usage(params, job.choices);
      out += event(last);
    }
    out += "data: [DONE]\n\n";
    finished = true;
  }
  return out;
}

}  // namespace

void HttpFrontend::stream_job(const std::shared_ptr<Job>& job, httplib::Response& response) {
  auto state = std::make_shared<StreamState>();
  response.set_header("Cache-Control", "no-cache");
  const auto interval = std::chrono::milliseconds(config_.stream_interval_ms);
  response.set_chunked_content_provider(
      "text/event-stream",
      [job, state, interval](std::size_t, httplib::DataSink& sink) {
        std::string out;
        bool finished = false;
        // After a write, tokens gather for the stream interval: one wake-up and one write
        // carry them all.
        if (interval.count() > 0 && state->last_write) {
          std::this_thread::sleep_until(*state->last_write + interval);
        }
        {
          std::unique_lock lock(job->mutex);
          job->changed.wait_for(lock, kWriterWait, [&] { return job->version != state->seen; });
          state->seen = job->version;
          out = stream_events(*job, *state, finished);
        }
        if (finished) {
          if (!sink.write(out.data(), out.size())) return false;
          state->done = true;
          sink.done();
          return true;
        }
        // A write notices a client that left; with nothing to write, ask the socket.
        if (out.empty()) return sink.is_writable();
        state->last_write = Clock::now();
        return sink.write(out.data(), out.size());
      },
      [this, job, state](bool) {
        if (!state->done) scheduler_.cancel(job);
        response_ended();
      });
}

void HttpFrontend::wait_job(const std::shared_ptr<Job>& job, httplib::Response& response) {
  auto done = std::make_shared<bool>(false);
  response.set_chunked_content_provider(
      "application/json",
      [job, done](std::size_t, httplib::DataSink& sink) {
        std::string out;
        {
          std::unique_lock lock(job->mutex);
          job->changed.wait_for(lock, kWriterWait,
                                [&] { return job->unfinished == 0 || !job->error.empty(); });
          if (!job->error.empty()) {
            out = dump(error_body({500, job->error, "server_error", "", ""}));
          } else if (job->unfinished == 0) {
            out = dump(completion_response(job->header, job->params, job->choices));
          }
        }
        if (out.empty()) return sink.is_writable();
        if (!sink.write(out.data(), out.size())) return false;
        *done = true;
        sink.done();
        return true;
      },
      [this, job, done](bool) {
        if (!*done) scheduler_.cancel(job);
        response_ended();
      });
}

void HttpFrontend::response_ended() {
  {
    const std::lock_guard lock(mutex_);
    --active_responses_;
  }
  ended_.notify_all();
}

void HttpFrontend::admin_reload(httplib::Response& response) {
  const ReloadResult result = scheduler_.reload().get();
  if (!result.ok) {
    return send_error(
        response, {422, "The reload failed and the old weights are still served: " + result.error,
                   "invalid_request_error", "", "reload_failed"});
  }
  Json out;
  out["reloaded"] = true;
  out["weights_step"] = result.step;
  out["checkpoint"] = result.directory;
  response.set_content(dump(out), "application/json");
}

void HttpFrontend::start() {
  int port = config_.port;
  bool bound = false;
  if (port == 0) {
    port = server_->bind_to_any_port(config_.host);
    bound = port > 0;
  } else {
    bound = server_->bind_to_port(config_.host, port);
  }
  if (!bound) {
    throw InvalidArgument(fmt::format("cannot listen on {} port {}: {}", config_.host, config_.port,
                                      errno != 0 ? std::strerror(errno) : "bind failed"));
  }
  static_cast<WideBacklogServer&>(*server_).widen_backlog();
  const bool ipv6 = config_.host.find(':') != std::string::npos;
  url_ = ipv6 ? fmt::format("http://[{}]:{}", config_.host, port)
              : fmt::format("http://{}:{}", config_.host, port);
  listener_ = std::thread([this] { server_->listen_after_bind(); });
}

void HttpFrontend::stop(std::chrono::seconds timeout) {
  {
    std::unique_lock lock(mutex_);
    ended_.wait_for(lock, timeout, [&] { return active_responses_ == 0; });
  }
  server_->stop();
  if (listener_.joinable()) listener_.join();
}

}  // namespace meshtensor::serve
