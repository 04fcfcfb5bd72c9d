#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <meshtensor/serve/metrics.hpp>
#include <meshtensor/serve/scheduler.hpp>
#include <meshtensor/serve/server.hpp>

#include "http_connection.hpp"

namespace meshtensor::serve {

/// What the HTTP side knows of the served model.
struct ServedModel {
  /// The model's config, its context the positions a choice may use (ServeConfig::max_context).
  nn::DecoderSpec config;
  std::string architecture;  ///< the model's own config text
  std::shared_ptr<const tokenize::Tokenizer> tokenizer;
  std::string directory;
  ChatSupport chat;  ///< the tokenizer's chat format, or why there is none
};

/// The HTTP server on world rank 0: an event loop on a few threads that accepts connections
/// (up to a limit; more are answered 503 and closed), routes requests, checks the API key,
/// parses and validates completions, queues them and writes each job's choices out. Its
/// threads never generate and never block on a client or on the generation loop.
class HttpFrontend : private HttpRoutes {
 public:
  HttpFrontend(const ServeConfig& config, Scheduler& scheduler, Metrics& metrics,
               ServedModel model);
  ~HttpFrontend() override;
  HttpFrontend(const HttpFrontend&) = delete;
  HttpFrontend& operator=(const HttpFrontend&) = delete;

  /// Binds the address (InvalidArgument naming it when it cannot) and starts serving.
  void start();
  /// The base URL, once started.
  const std::string& url() const { return url_; }
  /// The most connections served at once (ServeConfig::max_connections, less when the
  /// process may not open that many files).
  std::int64_t connection_limit() const { return connection_limit_; }
  /// The served checkpoint changed.
  void set_model(const ServedModel& model);
  /// Waits (at most `timeout`) until every accepted response has been written, then stops.
  void stop(std::chrono::seconds timeout);

 private:
  std::optional<Answer> screen(const HttpHeader& header) override;
  Reply route(const HttpRequest& request, std::function<void()> on_change) override;
  void answered(const std::string& target, int status) override;
  void abandoned(const std::shared_ptr<Job>& job) override;

  void bind();
  void accept();
  void admit(net::ip::tcp::socket socket);
  Reply get(const std::string& path);
  /// POST /v1/completions, or /v1/chat/completions when `chat`.
  Reply completions(const HttpRequest& request, bool chat, std::function<void()> on_change);
  Reply admin_reload();
  Json model_object() const;
  void response_ended();

  const ServeConfig& config_;
  Scheduler& scheduler_;
  Metrics& metrics_;
  HttpLimits limits_;
  mutable std::mutex mutex_;
  ServedModel model_;
  std::mt19937_64 random_;
  std::string url_;
  std::condition_variable ended_;
  std::int64_t active_responses_ = 0;
  std::int64_t connection_limit_ = 0;
  std::atomic<std::int64_t> open_connections_{0};
  // Destroyed first (in this order's reverse), while the members above still exist for the
  // connections that end with them.
  std::unique_ptr<net::io_context> io_;
  std::unique_ptr<net::ip::tcp::acceptor> acceptor_;
  std::unique_ptr<net::steady_timer> accept_retry_;
  std::vector<std::thread> threads_;
};

}  // namespace meshtensor::serve
