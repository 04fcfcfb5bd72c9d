#include "http_frontend.hpp"

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/strand.hpp>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <pthread.h>
#include <sys/resource.h>

#include <fmt/format.h>

#include <meshtensor/core/error.hpp>

namespace meshtensor::serve {

namespace {

using boost::system::error_code;

/// Descriptors the process keeps for itself besides its connections (files, logs, sockets).
constexpr std::int64_t kReservedFiles = 128;

Reply answer_with(Answer answer) {
  Reply reply;
  reply.answer = std::move(answer);
  return reply;
}

Reply json_reply(const Json& value) {
  return answer_with({200, dump(value)});
}

/// A request target's path (the query removed).
std::string path_of(std::string_view target) {
  return std::string(target.substr(0, target.find('?')));
}

/// A bounded, printable excerpt of a path for messages.
std::string shown_path(std::string_view path) {
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

Answer no_route(std::string_view method, const std::string& path) {
  if (const char* allowed = method_of(path)) {
    return error_answer(
        {405, fmt::format("{} is not allowed on {}: use {}", shown_path(method), path, allowed),
         "invalid_request_error", "", ""});
  }
  return error_answer({404,
                       fmt::format("No endpoint {} {}: the server has POST /v1/completions, "
                                   "POST /v1/chat/completions, GET /v1/models, GET /health, GET "
                                   "/metrics and POST /admin/reload",
                                   shown_path(method), shown_path(path)),
                       "invalid_request_error", "", ""});
}

bool same_secret(std::string_view given, const std::string& expected) {
  // Compares every byte whatever differs first, so timing does not tell how much matched.
  unsigned char differ = given.size() == expected.size() ? 0 : 1;
  for (std::size_t i = 0; i < given.size(); ++i)
    differ |= static_cast<unsigned char>(given[i] ^
                                         expected[i % std::max<std::size_t>(expected.size(), 1)]);
  return differ == 0;
}

/// Lets the process open `wanted` files if its hard limit allows; returns how many it may.
std::int64_t raise_file_limit(std::int64_t wanted) {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return wanted;
  if (limit.rlim_cur != RLIM_INFINITY && static_cast<std::int64_t>(limit.rlim_cur) < wanted) {
    limit.rlim_cur = limit.rlim_max == RLIM_INFINITY
                         ? static_cast<rlim_t>(wanted)
                         : std::min<rlim_t>(limit.rlim_max, static_cast<rlim_t>(wanted));
    (void)setrlimit(RLIMIT_NOFILE, &limit);
    (void)getrlimit(RLIMIT_NOFILE, &limit);
  }
  return limit.rlim_cur == RLIM_INFINITY ? wanted : static_cast<std::int64_t>(limit.rlim_cur);
}

}  // namespace

HttpFrontend::HttpFrontend(const ServeConfig& config, Scheduler& scheduler, Metrics& metrics,
                           ServedModel model)
    : config_(config),
      scheduler_(scheduler),
      metrics_(metrics),
      model_(std::move(model)),
      random_(std::random_device{}()),
      io_(std::make_unique<net::io_context>()) {
  limits_.max_body_bytes = static_cast<std::uint64_t>(config_.limits.max_body_bytes);
  limits_.request_timeout = config_.request_timeout;
  limits_.idle_timeout = config_.idle_timeout;
  limits_.stream_interval = std::chrono::milliseconds(config_.stream_interval_ms);
}

HttpFrontend::~HttpFrontend() {
  if (!threads_.empty()) {
    io_->stop();
    for (std::thread& thread : threads_)
      thread.join();
  }
}

std::optional<Answer> HttpFrontend::screen(const HttpHeader& header) {
  const std::string path = path_of(view(header.target()));
  const bool guarded = path.rfind("/v1/", 0) == 0 || path.rfind("/admin/", 0) == 0;
  if (!config_.api_key.empty() && guarded) {
    const std::string_view given = view(header[http::field::authorization]);
    const std::string_view prefix = "Bearer ";
    if (given.empty()) {
      return error_answer({401, "You didn't provide an API key: send 'Authorization: Bearer KEY'",
                           "invalid_request_error", "", "invalid_api_key"});
    }
    if (given.substr(0, prefix.size()) != prefix ||
        !same_secret(given.substr(prefix.size()), config_.api_key)) {
      return error_answer(
          {401, "Incorrect API key provided", "invalid_request_error", "", "invalid_api_key"});
    }
  }
  // A body must say its length, so that it is judged against the limit before it is read.
  if (header.method() == http::verb::post && header.count(http::field::content_length) == 0) {
    return error_answer({411,
                         "A POST needs a Content-Length header: bodies are checked against the "
                         "limit before they are read (send an empty body with curl -d '')",
                         "invalid_request_error", "", ""});
  }
  return std::nullopt;
}

Reply HttpFrontend::route(const HttpRequest& request, std::function<void()> on_change) {
  const std::string path = path_of(view(request.target()));
  const http::verb method = request.method();
  const char* served_by = method_of(path);
  if (method == http::verb::get && served_by != nullptr && std::string_view(served_by) == "GET")
    return get(path);
  if (method == http::verb::post && path == "/v1/completions")
    return completions(request, false, std::move(on_change));
  if (method == http::verb::post && path == "/v1/chat/completions")
    return completions(request, true, std::move(on_change));
  if (method == http::verb::post && path == "/admin/reload") return admin_reload();
  return answer_with(no_route(view(request.method_string()), path));
}

Reply HttpFrontend::get(const std::string& path) {
  if (path == "/health") {
    const bool draining = scheduler_.draining();
    return answer_with(
        {draining ? 503 : 200, draining ? R"({"status":"draining"})" : R"({"status":"ok"})"});
  }
  if (path == "/metrics")
    return answer_with({200, metrics_.prometheus_text(), "text/plain; version=0.0.4"});
  if (path == "/v1/models") {
    Json out;
    out["object"] = "list";
    out["data"] = Json::array({model_object()});
    return json_reply(out);
  }
  const std::string id = path.substr(std::string("/v1/models/").size());
  if (id != config_.model_name) {
    return answer_with(
        error_answer({404,
                      fmt::format("The model '{}' does not exist: this server serves '{}'",
                                  shown_path(id), config_.model_name),
                      "invalid_request_error", "model", "model_not_found"}));
  }
  return json_reply(model_object());
}

void HttpFrontend::answered(const std::string& target, int status) {
  metrics_.count_request(endpoint_label(path_of(target)), status);
}

void HttpFrontend::abandoned(const std::shared_ptr<Job>& job) {
  scheduler_.cancel(job);
}

Json HttpFrontend::model_object() const {
  const std::lock_guard lock(mutex_);
  Json model;
  model["id"] = config_.model_name;
  model["object"] = "model";
  model["created"] = 0;
  model["owned_by"] = "meshtensor";
  model["architecture"] = model_.architecture;
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

Reply HttpFrontend::completions(const HttpRequest& request, bool chat,
                                std::function<void()> on_change) {
  auto job = std::make_shared<Job>();
  ServedModel model;
  std::uint64_t seed = 0;
  {
    const std::lock_guard lock(mutex_);
    model = model_;
    seed = random_();
    job->header.id = fmt::format("{}-{:016x}", chat ? "chatcmpl" : "cmpl", random_());
  }
  try {
    job->params = chat ? parse_chat_request(request.body(), config_.model_name, model.config,
                                            model.chat, config_.limits, seed)
                       : parse_completion_request(request.body(), config_.model_name, model.config,
                                                  std::move(model.tokenizer), config_.limits, seed);
    job->header.created = static_cast<std::int64_t>(std::time(nullptr));
    job->header.model = config_.model_name;
    job->header.seed = job->params.sampling.seed;
    job->on_change = std::move(on_change);
    scheduler_.submit(job);
  } catch (const ApiError& error) {
    return answer_with(error_answer(error));
  }
  {
    const std::lock_guard lock(mutex_);
    ++active_responses_;
  }
  Reply reply;
  reply.job = std::move(job);
  reply.on_end = [this] { response_ended(); };
  return reply;
}

void HttpFrontend::response_ended() {
  {
    const std::lock_guard lock(mutex_);
    --active_responses_;
  }
  ended_.notify_all();
}

Reply HttpFrontend::admin_reload() {
  Reply reply;
  reply.poll = [result = scheduler_.reload()]() -> std::optional<Answer> {
    if (result.wait_for(std::chrono::seconds(0)) != std::future_status::ready) return std::nullopt;
    const ReloadResult& done = result.get();
    if (!done.ok) {
      return error_answer({422,
                           "The reload failed and the old weights are still served: " + done.error,
                           "invalid_request_error", "", "reload_failed"});
    }
    Json out;
    out["reloaded"] = true;
    out["weights_step"] = done.step;
    out["checkpoint"] = done.directory;
    return Answer{200, dump(out)};
  };
  return reply;
}

void HttpFrontend::bind() {
  const auto cannot = [&](const std::string& why) {
    return InvalidArgument(
        fmt::format("cannot listen on {} port {}: {}", config_.host, config_.port, why));
  };
  error_code ec;
  net::ip::tcp::resolver resolver(*io_);
  const auto endpoints = resolver.resolve(config_.host, std::to_string(config_.port),
                                          net::ip::resolver_base::passive, ec);
  if (ec || endpoints.empty()) {
    throw cannot(
        fmt::format("'{}' is neither an address nor a host name this machine resolves "
                    "({})",
                    config_.host, ec ? ec.message() : "no address"));
  }
  const net::ip::tcp::endpoint endpoint = endpoints.begin()->endpoint();
  acceptor_ = std::make_unique<net::ip::tcp::acceptor>(*io_);
  // SO_REUSEADDR allows a quick restart; SO_REUSEPORT is not set, so a second server cannot
  // share the port silently.
  if (!acceptor_->open(endpoint.protocol(), ec) &&
      !acceptor_->set_option(net::socket_base::reuse_address(true), ec) &&
      !acceptor_->bind(endpoint, ec)) {
    acceptor_->listen(net::socket_base::max_listen_connections, ec);
  }
  if (ec) throw cannot(ec.message());
  const unsigned short port = acceptor_->local_endpoint().port();
  const bool ipv6 = endpoint.address().is_v6();
  url_ = ipv6 ? fmt::format("http://[{}]:{}", endpoint.address().to_string(), port)
              : fmt::format("http://{}:{}", endpoint.address().to_string(), port);
}

void HttpFrontend::accept() {
  acceptor_->async_accept(net::make_strand(*io_),
                          [this](error_code ec, net::ip::tcp::socket socket) {
                            if (ec == net::error::operation_aborted) return;
                            if (ec) {
                              // Out of descriptors, say: try again shortly rather than spin.
                              accept_retry_->expires_after(std::chrono::milliseconds(50));
                              accept_retry_->async_wait([this](error_code wait_ec) {
                                if (!wait_ec) accept();
                              });
                              return;
                            }
                            admit(std::move(socket));
                            accept();
                          });
}

void HttpFrontend::admit(net::ip::tcp::socket socket) {
  error_code ignored;
  socket.set_option(net::ip::tcp::no_delay(true), ignored);
  HttpRoutes& routes = *this;
  if (open_connections_.fetch_add(1) >= connection_limit_) {
    open_connections_.fetch_sub(1);
    auto refused = std::make_shared<HttpConnection>(std::move(socket), routes, limits_, nullptr);
    return refused->refuse(
        error_answer({503,
                      fmt::format("The server has {} connections open, its limit: retry shortly",
                                  connection_limit_),
                      "server_error", "", "too_many_connections"}));
  }
  std::make_shared<HttpConnection>(std::move(socket), routes, limits_, [this] {
    open_connections_.fetch_sub(1);
  })->start();
}

void HttpFrontend::start() {
  connection_limit_ =
      std::min(config_.max_connections,
               raise_file_limit(config_.max_connections + kReservedFiles) - kReservedFiles);
  if (connection_limit_ < 1) {
    throw InvalidArgument(fmt::format(
        "the process may open too few files to serve connections (RLIMIT_NOFILE); raise it "
        "with ulimit -n"));
  }
  bind();
  accept_retry_ = std::make_unique<net::steady_timer>(*io_);
  accept();
  const std::int64_t count = config_.http_threads > 0 ? config_.http_threads : 2;
  for (std::int64_t i = 0; i < count; ++i) {
    threads_.emplace_back([this] {
      // The event loop runs at a lower priority (nice +5) than the generation loop, so that
      // parsing and writing never delay a decode step on a busy machine. Linux keeps a nice
      // value per thread; failing to set it only costs speed.
      (void)setpriority(PRIO_PROCESS, 0, 5);
      (void)pthread_setname_np(pthread_self(), "meshtensor-http");
      io_->run();
    });
  }
}

void HttpFrontend::stop(std::chrono::seconds timeout) {
  {
    std::unique_lock lock(mutex_);
    ended_.wait_for(lock, timeout, [&] { return active_responses_ == 0; });
  }
  net::post(*io_, [this] {
    error_code ignored;
    acceptor_->close(ignored);
  });
  io_->stop();
  for (std::thread& thread : threads_)
    thread.join();
  threads_.clear();
}

}  // namespace meshtensor::serve
