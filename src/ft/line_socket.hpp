#pragma once

#include <cstdint>
#include <string>
#include <utility>

namespace meshtensor::ft {

/// One TCP connection carrying newline-ended text lines, every wait bounded. Closing is the
/// destructor's; a connection is moved, never copied.
class LineSocket {
 public:
  /// Connects to host:port within `timeout` seconds; CommError naming the address otherwise.
  static LineSocket connect(const std::string& host, std::uint16_t port, double timeout);
  /// Takes an accepted descriptor.
  explicit LineSocket(int fd) : fd_(fd) {}
  LineSocket(LineSocket&& other) noexcept;
  LineSocket& operator=(LineSocket&& other) noexcept;
  LineSocket(const LineSocket&) = delete;
  LineSocket& operator=(const LineSocket&) = delete;
  ~LineSocket();

  /// Sends `line` and a newline; CommError when the peer is gone.
  void send_line(const std::string& line);
  /// The next line (without its newline) within `timeout` seconds; TimeoutError when the wait
  /// ran out, CommError when the peer closed or the line passes 16 MiB.
  std::string read_line(double timeout);
  /// The numeric address of this end of the connection ("" when it has none): the interface
  /// the peer is reached through.
  std::string local_host() const;
  /// Whether a descriptor is held.
  bool open() const { return fd_ >= 0; }
  /// Shuts both directions down: a thread blocked reading wakes up.
  void shutdown();

 private:
  int fd_ = -1;
  std::string pending_;
};

/// "HOST:PORT" split; ParseError naming the text when it is not one.
std::pair<std::string, std::uint16_t> parse_address(const std::string& text);

}  // namespace meshtensor::ft
