#pragma once

// One client connection of the HTTP server, event-driven on Boost.Beast/Asio: it holds a socket
// and a buffer, never a thread, so idle and slow clients cost the others nothing. Requests are
// read with deadlines (the headers and body of one request, the idle time between requests),
// their size is judged from the headers before a body byte is read, pipelined requests are
// answered in order, and a followed job's output is written as it arrives.

#include <atomic>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "job_writer.hpp"

namespace meshtensor::serve {

namespace net = boost::asio;
namespace http = boost::beast::http;
using HttpRequest = http::request<http::string_body>;
using HttpHeader = http::request_header<>;

/// Beast's string views as the standard's.
inline std::string_view view(boost::beast::string_view text) {
  return {text.data(), text.size()};
}

/// How long and how large a connection's requests may be.
struct HttpLimits {
  std::uint64_t max_body_bytes = 1 << 20;
  std::uint32_t max_header_bytes = 64 << 10;
  std::chrono::milliseconds request_timeout{30000};  ///< one request's headers and body
  std::chrono::milliseconds idle_timeout{60000};     ///< a kept-alive connection between requests
  std::chrono::milliseconds write_timeout{30000};    ///< one write to a client that stopped reading
  std::chrono::milliseconds stream_interval{10};     ///< a stream's writes after its first
};

/// A complete response.
struct Answer {
  Answer() = default;
  Answer(int status_code, std::string text, std::string type = "application/json")
      : status(status_code), body(std::move(text)), content_type(std::move(type)) {}
  int status = 200;
  std::string body;
  std::string content_type = "application/json";
  std::vector<std::pair<std::string, std::string>> headers;
};

/// An OpenAI-shaped error answer (Retry-After: 1 with 429 and 503).
Answer error_answer(const ApiError& error);

/// How a route answers: at once, once `poll` returns an answer, or by following `job`.
struct Reply {
  std::optional<Answer> answer;
  std::function<std::optional<Answer>()> poll;
  std::shared_ptr<Job> job;
  std::function<void()> on_end;  ///< called once when the reply was written or abandoned
};

/// What a connection asks of the server.
class HttpRoutes {
 public:
  virtual ~HttpRoutes() = default;
  /// Judges a request by its headers, before its body is read: an answer refuses it.
  virtual std::optional<Answer> screen(const HttpHeader& header) = 0;
  /// Answers a whole request. `on_change` is what a job this starts must call on a change.
  virtual Reply route(const HttpRequest& request, std::function<void()> on_change) = 0;
  /// Every answer's status, with the request's target (empty when it had none).
  virtual void answered(const std::string& target, int status) = 0;
  /// The client of a followed job left before its end.
  virtual void abandoned(const std::shared_ptr<Job>& job) = 0;
};

/// One client connection; owned by its pending operations (and by a job's notifier while one
/// is followed), so it ends when the socket closes and nothing waits on it.
class HttpConnection : public std::enable_shared_from_this<HttpConnection> {
 public:
  HttpConnection(net::ip::tcp::socket socket, HttpRoutes& routes, const HttpLimits& limits,
                 std::function<void()> on_close);
  ~HttpConnection();
  HttpConnection(const HttpConnection&) = delete;
  HttpConnection& operator=(const HttpConnection&) = delete;

  /// Serves the connection's requests until it closes.
  void start();
  /// Answers once with `answer` and closes (a connection over the server's limit).
  void refuse(Answer answer);

 private:
  /// Hands a job's changes to the connection's strand; detached when the reply ends.
  struct Notifier;

  void wait_for_request();
  void read_header();
  void on_header(boost::system::error_code ec);
  void read_body();
  void on_body(boost::system::error_code ec);
  void read_failed(boost::system::error_code ec);
  void begin_reply(Reply reply);
  void send(Answer answer, bool close);
  void after_answer(boost::system::error_code ec, bool close);
  void poll_later();
  void follow(std::shared_ptr<Job> job);
  void pump();
  /// Writes stream bytes: the headers, or `events` (which start the stream interval).
  void write_stream(std::string text, bool finished, bool events);
  void check_peer();
  bool peer_gone();
  void end_reply();
  void linger();
  void linger_read();
  void close();

  boost::beast::tcp_stream stream_;
  HttpRoutes& routes_;
  const HttpLimits& limits_;
  std::function<void()> on_close_;
  boost::beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  net::steady_timer timer_;       ///< idle wait, polls and the stream interval
  net::steady_timer peer_timer_;  ///< while a job is followed: is the client still there?
  std::string target_;
  unsigned version_ = 11;
  bool keep_alive_ = true;
  bool closed_ = false;
  // The reply in progress.
  std::function<void()> on_end_;
  std::function<std::optional<Answer>()> poll_;
  std::optional<JobWriter> writer_;
  std::shared_ptr<Notifier> notifier_;
  bool finished_ = false;  ///< the followed job's last output was taken
  bool writing_ = false;
  bool interval_wait_ = false;
  std::optional<std::chrono::steady_clock::time_point> last_write_;
  std::atomic<bool> pump_posted_{false};
  std::vector<char> drain_;
  std::size_t lingered_ = 0;
};

}  // namespace meshtensor::serve
