#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>

#include <meshtensor/serve/metrics.hpp>
#include <meshtensor/serve/scheduler.hpp>
#include <meshtensor/serve/server.hpp>

namespace httplib {
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace meshtensor::serve {

/// What the HTTP side knows of the served model.
struct ServedModel {
  nn::GptConfig config;
  std::string directory;
};

/// The HTTP server on world rank 0: routes, the API key, request parsing and validation, and
/// the writers that stream each job's choices out. Its threads never generate.
class HttpFrontend {
 public:
  HttpFrontend(const ServeConfig& config, Scheduler& scheduler, Metrics& metrics,
               ServedModel model);
  ~HttpFrontend();
  /// Binds the address (InvalidArgument naming it when it cannot) and starts serving.
  void start();
  /// The base URL, once started.
  const std::string& url() const { return url_; }
  /// The served checkpoint changed.
  void set_model(const ServedModel& model);
  /// Waits (at most `timeout`) until every accepted response has been written, then stops.
  void stop(std::chrono::seconds timeout);

 private:
  void add_routes();
  bool authorized(const httplib::Request& request, httplib::Response& response) const;
  /// 411 for a POST without Content-Length (a chunked body would be read whole before the
  /// size limit applies).
  static bool length_given(const httplib::Request& request, httplib::Response& response);
  void completions(const httplib::Request& request, httplib::Response& response);
  void stream_job(const std::shared_ptr<Job>& job, httplib::Response& response);
  void wait_job(const std::shared_ptr<Job>& job, httplib::Response& response);
  void admin_reload(httplib::Response& response);
  Json model_object() const;
  void response_ended();

  const ServeConfig& config_;
  Scheduler& scheduler_;
  Metrics& metrics_;
  mutable std::mutex mutex_;
  ServedModel model_;
  std::mt19937_64 random_;
  std::unique_ptr<httplib::Server> server_;
  std::thread listener_;
  std::string url_;
  std::condition_variable ended_;
  std::int64_t active_responses_ = 0;
};

}  // namespace meshtensor::serve
