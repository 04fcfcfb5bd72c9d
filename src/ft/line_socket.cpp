#include "line_socket.hpp"

#include <arpa/inet.h>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>
#include <utility>

#include <fmt/format.h>

#include <meshtensor/core/error.hpp>

namespace meshtensor::ft {

namespace {

constexpr std::size_t kLongestLine = std::size_t{16} << 20;

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

/// Waits up to `timeout` seconds for `events` on `fd`; false when the time ran out.
bool wait_for(int fd, short events, double timeout) {
  pollfd p{fd, events, 0};
  const int ms = static_cast<int>(std::max(0.0, timeout) * 1000.0);
  int ready = 0;
  do {
    ready = ::poll(&p, 1, ms);
  } while (ready < 0 && errno == EINTR);
  return ready > 0;
}

}  // namespace

std::pair<std::string, std::uint16_t> parse_address(const std::string& text) {
  const auto colon = text.rfind(':');
  const auto bad = [&] {
    return ParseError(fmt::format("'{}' is not HOST:PORT (a port from 1 to 65535)", text));
  };
  if (colon == std::string::npos || colon == 0 || colon + 1 == text.size()) throw bad();
  std::int64_t port = 0;
  for (const char c : text.substr(colon + 1)) {
    if (c < '0' || c > '9' || port > 65535) throw bad();
    port = port * 10 + (c - '0');
  }
  if (port < 1 || port > 65535) throw bad();
  return {text.substr(0, colon), static_cast<std::uint16_t>(port)};
}

LineSocket LineSocket::connect(const std::string& host, std::uint16_t port, double timeout) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string address = fmt::format("{}:{}", host, port);
  if (const int error = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
      error != 0) {
    throw CommError(fmt::format("cannot resolve {}: {}", address, ::gai_strerror(error)));
  }
  const auto start = std::chrono::steady_clock::now();
  std::string last_error = "no address";
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) continue;
    if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0 ||
        (errno == EINPROGRESS && wait_for(fd, POLLOUT, timeout - seconds_since(start)))) {
      int error = 0;
      socklen_t size = sizeof(error);
      ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &size);
      if (error == 0) {
        const int one = 1;
        ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        ::freeaddrinfo(found);
        return LineSocket(fd);
      }
      last_error = std::strerror(error);
    } else {
      last_error = errno == EINPROGRESS ? "timed out" : std::strerror(errno);
    }
    ::close(fd);
  }
  ::freeaddrinfo(found);
  throw CommError(
      fmt::format("cannot connect to {} within {} s: {}", address, timeout, last_error));
}

LineSocket::LineSocket(LineSocket&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), pending_(std::move(other.pending_)) {}

LineSocket& LineSocket::operator=(LineSocket&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    pending_ = std::move(other.pending_);
  }
  return *this;
}

LineSocket::~LineSocket() {
  if (fd_ >= 0) ::close(fd_);
}

void LineSocket::shutdown() {
  if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
}

void LineSocket::send_line(const std::string& line) {
  const std::string data = line + "\n";
  std::size_t sent = 0;
  while (sent < data.size()) {
    const ssize_t n = ::send(fd_, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!wait_for(fd_, POLLOUT, 10.0)) throw CommError("the peer takes no data for 10 s");
      continue;
    }
    if (n <= 0) throw CommError(fmt::format("the connection is gone: {}", std::strerror(errno)));
    sent += static_cast<std::size_t>(n);
  }
}

std::string LineSocket::read_line(double timeout) {
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    if (const auto end = pending_.find('\n'); end != std::string::npos) {
      std::string line = pending_.substr(0, end);
      pending_.erase(0, end + 1);
      return line;
    }
    if (pending_.size() > kLongestLine) throw CommError("a line longer than 16 MiB");
    const double left = timeout - seconds_since(start);
    if (left <= 0 || !wait_for(fd_, POLLIN, left))
      throw TimeoutError(fmt::format("no answer within {} s", timeout));
    char buffer[65536];
    const ssize_t n = ::recv(fd_, buffer, sizeof(buffer), 0);
    if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
    if (n <= 0) throw CommError("the connection closed");
    pending_.append(buffer, static_cast<std::size_t>(n));
  }
}

std::string LineSocket::local_host() const {
  sockaddr_storage where{};
  socklen_t size = sizeof(where);
  if (fd_ < 0 || ::getsockname(fd_, reinterpret_cast<sockaddr*>(&where), &size) != 0) return {};
  char text[INET6_ADDRSTRLEN] = {};
  const void* address =
      where.ss_family == AF_INET6
          ? static_cast<const void*>(&reinterpret_cast<sockaddr_in6&>(where).sin6_addr)
          : static_cast<const void*>(&reinterpret_cast<sockaddr_in&>(where).sin_addr);
  if (::inet_ntop(where.ss_family, address, text, sizeof(text)) == nullptr) return {};
  return text;
}

}  // namespace meshtensor::ft
