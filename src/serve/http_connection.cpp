#include "http_connection.hpp"

#include <boost/asio/dispatch.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/write.hpp>
#include <sys/socket.h>

#include <fmt/format.h>

namespace meshtensor::serve {

namespace {

using boost::system::error_code;
using Clock = std::chrono::steady_clock;

/// How often a followed job's client is checked (and the job looked at, should a change have
/// been missed).
constexpr auto kPeerCheck = std::chrono::milliseconds(100);
constexpr auto kPollInterval = std::chrono::milliseconds(20);
/// After a closing answer, what is read and dropped so that the answer is not lost to a reset
/// (the client may still be sending a body the server will not read).
constexpr auto kLingerTime = std::chrono::seconds(2);
constexpr std::size_t kLingerBytes = std::size_t{4} << 20;

Answer bad_request(int status, const std::string& message) {
  return error_answer({status, message, "invalid_request_error", "", ""});
}

Answer internal_error(const std::exception& e) {
  return error_answer({500, fmt::format("Internal error: {}", e.what()), "server_error", "", ""});
}

/// The answer to a request that could not be read, or nothing (close silently).
std::optional<Answer> unreadable(const error_code& ec, std::uint64_t max_body_bytes) {
  if (ec == http::error::body_limit) {
    return error_answer({413,
                         fmt::format("The request body is larger than the server accepts ({} "
                                     "bytes at most)",
                                     max_body_bytes),
                         "invalid_request_error", "", ""});
  }
  if (ec == http::error::header_limit) {
    return bad_request(431, "The request's headers are larger than the server accepts");
  }
  if (ec == http::error::bad_content_length || ec == http::error::bad_transfer_encoding) {
    return bad_request(400,
                       "The request's Content-Length or Transfer-Encoding is malformed, repeated "
                       "with another value, or conflicting");
  }
  if (ec.category() == make_error_code(http::error::bad_target).category() &&
      ec != http::error::end_of_stream && ec != http::error::partial_message) {
    return bad_request(400, fmt::format("The request could not be read as HTTP: {}", ec.message()));
  }
  return std::nullopt;
}

}  // namespace

Answer error_answer(const ApiError& error) {
  Answer answer{error.status, dump(error_body(error))};
  if (error.status == 429 || error.status == 503) answer.headers.emplace_back("Retry-After", "1");
  return answer;
}

struct HttpConnection::Notifier {
  std::mutex mutex;
  std::weak_ptr<HttpConnection> connection;

  void poke() {
    const std::lock_guard lock(mutex);
    const std::shared_ptr<HttpConnection> target = connection.lock();
    if (!target || target->pump_posted_.exchange(true)) return;
    net::post(target->stream_.get_executor(), [target] { target->pump(); });
  }
  void detach() {
    const std::lock_guard lock(mutex);
    connection.reset();
  }
};

HttpConnection::HttpConnection(net::ip::tcp::socket socket, HttpRoutes& routes,
                               const HttpLimits& limits, std::function<void()> on_close)
    : stream_(std::move(socket)),
      routes_(routes),
      limits_(limits),
      on_close_(std::move(on_close)),
      timer_(stream_.get_executor()),
      peer_timer_(stream_.get_executor()) {}

HttpConnection::~HttpConnection() {
  end_reply();
  if (on_close_) on_close_();
}

void HttpConnection::start() {
  net::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->wait_for_request(); });
}

void HttpConnection::refuse(Answer answer) {
  net::dispatch(stream_.get_executor(), [self = shared_from_this(), answer = std::move(answer)] {
    self->send(answer, true);
  });
}

void HttpConnection::wait_for_request() {
  if (closed_) return;
  if (buffer_.size() > 0) return read_header();  // a pipelined request is already here
  timer_.expires_after(limits_.idle_timeout);
  timer_.async_wait([self = shared_from_this()](error_code ec) {
    if (!ec) self->close();
  });
  stream_.socket().async_wait(net::socket_base::wait_read,
                              [self = shared_from_this()](error_code ec) {
                                self->timer_.cancel();
                                if (ec || self->closed_) return self->close();
                                self->read_header();
                              });
}

void HttpConnection::read_header() {
  parser_.emplace();
  parser_->header_limit(limits_.max_header_bytes);
  parser_->body_limit(limits_.max_body_bytes);
  target_.clear();
  stream_.expires_after(limits_.request_timeout);
  http::async_read_header(
      stream_, buffer_, *parser_,
      [self = shared_from_this()](error_code ec, std::size_t) { self->on_header(ec); });
}

void HttpConnection::on_header(error_code ec) {
  if (parser_->is_header_done()) {
    const HttpHeader& header = parser_->get();
    target_ = std::string(view(header.target()));
    version_ = header.version();
    keep_alive_ = parser_->keep_alive();
  }
  if (ec) return read_failed(ec);
  std::optional<Answer> refused;
  try {
    refused = routes_.screen(parser_->get());
  } catch (const std::exception& e) {
    refused = internal_error(e);
  }
  if (refused) return send(std::move(*refused), !parser_->is_done());
  if (parser_->get()[http::field::expect] == "100-continue") {
    auto text = std::make_shared<std::string>("HTTP/1.1 100 Continue\r\n\r\n");
    net::async_write(stream_, net::buffer(*text),
                     [self = shared_from_this(), text](error_code write_ec, std::size_t) {
                       if (write_ec) return self->close();
                       self->read_body();
                     });
    return;
  }
  read_body();
}

void HttpConnection::read_body() {
  http::async_read(stream_, buffer_, *parser_,
                   [self = shared_from_this()](error_code ec, std::size_t) { self->on_body(ec); });
}

void HttpConnection::on_body(error_code ec) {
  if (ec) return read_failed(ec);
  stream_.expires_never();
  const HttpRequest request = parser_->release();
  auto self = shared_from_this();
  auto notifier = std::make_shared<Notifier>();
  notifier->connection = self;
  Reply reply;
  try {
    reply = routes_.route(request, [notifier] { notifier->poke(); });
  } catch (const std::exception& e) {
    reply = {};
    reply.answer = internal_error(e);
  }
  if (reply.job) notifier_ = std::move(notifier);
  begin_reply(std::move(reply));
}

void HttpConnection::read_failed(error_code ec) {
  if (std::optional<Answer> answer = unreadable(ec, limits_.max_body_bytes)) {
    keep_alive_ = false;
    return send(std::move(*answer), true);
  }
  close();  // the client left, or its request did not arrive in time
}

void HttpConnection::begin_reply(Reply reply) {
  on_end_ = std::move(reply.on_end);
  if (reply.answer) return send(std::move(*reply.answer), false);
  if (reply.poll) {
    poll_ = std::move(reply.poll);
    return poll_later();
  }
  follow(std::move(reply.job));
}

void HttpConnection::send(Answer answer, bool close_after) {
  if (closed_) return;
  auto response = std::make_shared<http::response<http::string_body>>(
      static_cast<http::status>(answer.status), version_);
  response->set(http::field::content_type, answer.content_type);
  for (const auto& [name, value] : answer.headers)
    response->set(name, value);
  response->body() = std::move(answer.body);
  response->keep_alive(keep_alive_ && !close_after);
  response->prepare_payload();
  routes_.answered(target_, answer.status);
  stream_.expires_after(limits_.write_timeout);
  http::async_write(stream_, *response,
                    [self = shared_from_this(), response](error_code ec, std::size_t) {
                      self->after_answer(ec, !response->keep_alive());
                    });
}

void HttpConnection::after_answer(error_code ec, bool close_after) {
  end_reply();
  if (ec) return close();
  if (close_after) return linger();
  wait_for_request();
}

void HttpConnection::poll_later() {
  timer_.expires_after(kPollInterval);
  timer_.async_wait([self = shared_from_this()](error_code ec) {
    if (ec || self->closed_) return;
    if (std::optional<Answer> answer = self->poll_()) return self->send(std::move(*answer), false);
    self->poll_later();
  });
}

void HttpConnection::follow(std::shared_ptr<Job> job) {
  writer_.emplace(std::move(job));
  finished_ = false;
  last_write_.reset();
  check_peer();
  if (!writer_->streaming()) return pump();
  // The stream's status and headers go out at once; its events follow as chunks.
  routes_.answered(target_, 200);
  std::string head =
      "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n";
  head += version_ >= 11 ? "Transfer-Encoding: chunked\r\n" : "Connection: close\r\n";
  if (version_ >= 11 && !keep_alive_) head += "Connection: close\r\n";
  if (version_ < 11) keep_alive_ = false;
  write_stream(head + "\r\n", false, false);
}

void HttpConnection::pump() {
  pump_posted_ = false;
  if (!writer_ || finished_ || writing_ || interval_wait_ || closed_) return;
  if (writer_->streaming() && limits_.stream_interval.count() > 0 && last_write_ &&
      Clock::now() < *last_write_ + limits_.stream_interval) {
    // Tokens gather for the stream interval: one write carries them all.
    interval_wait_ = true;
    timer_.expires_at(*last_write_ + limits_.stream_interval);
    timer_.async_wait([self = shared_from_this()](error_code ec) {
      self->interval_wait_ = false;
      if (!ec) self->pump();
    });
    return;
  }
  JobWriter::Output out = writer_->next();
  if (out.text.empty() && !out.finished) return;
  finished_ = out.finished;
  if (!writer_->streaming()) return send({out.status, std::move(out.text)}, false);
  std::string frame = std::move(out.text);
  if (version_ >= 11) {
    frame = fmt::format("{:x}\r\n", frame.size()) + frame + "\r\n";
    if (out.finished) frame += "0\r\n\r\n";
  }
  write_stream(std::move(frame), out.finished, true);
}

void HttpConnection::write_stream(std::string text, bool finished, bool events) {
  auto data = std::make_shared<std::string>(std::move(text));
  writing_ = true;
  stream_.expires_after(limits_.write_timeout);
  net::async_write(stream_, net::buffer(*data),
                   [self = shared_from_this(), data, finished, events](error_code ec, std::size_t) {
                     self->writing_ = false;
                     // The stream interval starts at the first events, not at the headers: the
                     // first tokens go out as soon as they exist.
                     if (events) self->last_write_ = Clock::now();
                     if (ec) return self->close();
                     if (!finished) return self->pump();
                     self->end_reply();
                     if (self->keep_alive_) return self->wait_for_request();
                     self->linger();
                   });
}

void HttpConnection::check_peer() {
  peer_timer_.expires_after(kPeerCheck);
  peer_timer_.async_wait([self = shared_from_this()](error_code ec) {
    if (ec || !self->writer_ || self->closed_) return;
    if (self->peer_gone()) return self->close();
    self->pump();
    self->check_peer();
  });
}

bool HttpConnection::peer_gone() {
  char byte = 0;
  const ssize_t got = ::recv(stream_.socket().native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  return got == 0 || (got < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

void HttpConnection::end_reply() {
  if (writer_) {
    if (notifier_) notifier_->detach();
    notifier_.reset();
    if (!finished_) routes_.abandoned(writer_->job());
    writer_.reset();
    peer_timer_.cancel();
  }
  poll_ = nullptr;
  if (on_end_) std::exchange(on_end_, nullptr)();
}

void HttpConnection::linger() {
  error_code ignored;
  stream_.socket().shutdown(net::socket_base::shutdown_send, ignored);
  stream_.expires_after(kLingerTime);
  drain_.resize(64 << 10);
  linger_read();
}

void HttpConnection::linger_read() {
  stream_.async_read_some(net::buffer(drain_),
                          [self = shared_from_this()](error_code ec, std::size_t got) {
                            self->lingered_ += got;
                            if (ec || self->lingered_ > kLingerBytes) return self->close();
                            self->linger_read();
                          });
}

void HttpConnection::close() {
  if (closed_) return;
  closed_ = true;
  end_reply();
  timer_.cancel();
  peer_timer_.cancel();
  error_code ignored;
  stream_.socket().shutdown(net::socket_base::shutdown_both, ignored);
  stream_.socket().close(ignored);
}

}  // namespace meshtensor::serve
