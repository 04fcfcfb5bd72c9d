#include <algorithm>
#include <arpa/inet.h>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <netinet/in.h>
#include <optional>
#include <poll.h>
#include <random>
#include <sys/socket.h>
#include <thread>
#include <unistd.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <meshtensor/core/error.hpp>
#include <meshtensor/core/untrusted_json.hpp>
#include <meshtensor/ft/coordinator.hpp>

#include "line_socket.hpp"

namespace meshtensor::ft {

using Json = nlohmann::json;

namespace {

/// How often a waiting ask looks again whether its round can form (quorum_wait passing).
constexpr auto kPoll = std::chrono::milliseconds(50);
/// How long a connection's reader waits before it looks whether the coordinator stops.
constexpr double kReadSlice = 0.5;

Json quorum_json(const Quorum& q) {
  Json heal = Json::object();
  for (const auto& [group, source] : q.heal_from)
    heal[std::to_string(group)] = source;
  return {
      {"id", q.id},           {"round", q.round},  {"coordinator", q.coordinator}, {"step", q.step},
      {"members", q.members}, {"heal_from", heal}, {"fingerprint", q.fingerprint}};
}

Quorum quorum_of(const Json& j) {
  Quorum q;
  q.id = j.at("id").get<std::int64_t>();
  q.round = j.at("round").get<std::int64_t>();
  q.coordinator = j.at("coordinator").get<std::string>();
  q.step = j.at("step").get<std::int64_t>();
  q.members = j.at("members").get<std::vector<std::int64_t>>();
  for (const auto& [group, source] : j.at("heal_from").items())
    q.heal_from[std::stoll(group)] = source.get<std::int64_t>();
  q.fingerprint = j.at("fingerprint").get<std::string>();
  return q;
}

/// A reply from the coordinator (untrusted: it comes over the network).
Json parse_reply(const std::string& line) {
  Json reply = parse_untrusted_json(line, "the coordinator's reply");
  if (!reply.is_object() || !reply.contains("ok"))
    throw CommError("the coordinator's reply is not the protocol's");
  return reply;
}

std::string failure(const std::string& why) {
  return Json{{"ok", false}, {"error", why}}.dump();
}

/// The answer to a group whose incarnation is not live: it must join again.
std::string not_live(const std::string& why) {
  return Json{{"ok", false}, {"error", why}, {"rejoin", true}}.dump();
}

std::string new_incarnation() {
  std::random_device device;
  return fmt::format("{:08x}{:08x}-{}", device(), device(), ::getpid());
}

std::string success(Json body = Json::object()) {
  body["ok"] = true;
  return body.dump();
}

}  // namespace

struct Coordinator::Connection {
  Connection(int fd, std::int64_t number) : socket(fd), id(number) {}
  LineSocket socket;
  std::int64_t id;                    ///< unique among this coordinator's connections
  std::optional<std::int64_t> group;  ///< set by the join this connection made
  std::string incarnation;
};

Coordinator::Coordinator(CoordinatorConfig config)
    : config_(std::move(config)), incarnation_(new_incarnation()), state_(config_.rules) {
  const std::string address = fmt::format("{}:{}", config_.host, config_.port);
  sockaddr_in where{};
  where.sin_family = AF_INET;
  where.sin_port = htons(config_.port);
  if (::inet_pton(AF_INET, config_.host.c_str(), &where.sin_addr) != 1)
    throw ParseError(fmt::format("coordinator: '{}' is not an IPv4 address", config_.host));
  listener_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const int one = 1;
  ::setsockopt(listener_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (listener_ < 0 || ::bind(listener_, reinterpret_cast<sockaddr*>(&where), sizeof(where)) != 0 ||
      ::listen(listener_, 64) != 0) {
    const std::string why = std::strerror(errno);
    if (listener_ >= 0) ::close(listener_);
    throw CommError(fmt::format("coordinator: cannot listen on {}: {}", address, why));
  }
  socklen_t size = sizeof(where);
  ::getsockname(listener_, reinterpret_cast<sockaddr*>(&where), &size);
  port_ = ntohs(where.sin_port);
}

Coordinator::~Coordinator() {
  stop();
  ::close(listener_);
}

double Coordinator::now() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void Coordinator::start() {
  acceptor_ = std::thread([this] { accept_loop(); });
}

void Coordinator::stop() {
  if (stopping_.exchange(true)) return;
  {
    const std::lock_guard lock(mutex_);
    for (const auto& connection : connections_)
      connection->socket.shutdown();
  }
  changed_.notify_all();
  if (acceptor_.joinable()) acceptor_.join();
  for (std::thread& worker : workers_)
    worker.join();
}

std::vector<std::int64_t> Coordinator::live_groups() {
  const std::lock_guard lock(mutex_);
  return state_.live();
}

Quorum Coordinator::last_quorum() {
  const std::lock_guard lock(mutex_);
  return state_.last();
}

void Coordinator::accept_loop() {
  while (!stopping_) {
    pollfd p{listener_, POLLIN, 0};
    if (::poll(&p, 1, 200) <= 0) continue;
    const int fd = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    auto connection = std::make_shared<Connection>(fd, ++connections_made_);
    const std::lock_guard lock(mutex_);
    if (stopping_) break;
    connections_.push_back(connection);
    workers_.emplace_back([this, connection] { serve(connection); });
  }
}

void Coordinator::serve(const std::shared_ptr<Connection>& connection) {
  while (!stopping_) {
    std::string line;
    try {
      line = connection->socket.read_line(kReadSlice);
    } catch (const TimeoutError&) {
      continue;
    } catch (const CommError&) {
      break;  // the group's process closed it, or died
    }
    std::string reply;
    try {
      reply = answer(*connection, line);
    } catch (const Error& e) {
      reply = failure(e.what());
    } catch (const Json::exception& e) {
      reply = failure(fmt::format("a request that is not the protocol's: {}", e.what()));
    }
    try {
      connection->socket.send_line(reply);
    } catch (const CommError&) {
      break;
    }
  }
  const std::lock_guard lock(mutex_);
  if (connection->group) state_.leave(*connection->group, connection->incarnation, connection->id);
  changed_.notify_all();
}

std::string Coordinator::answer(Connection& connection, const std::string& line) {
  const Json request = parse_untrusted_json(line, "a coordinator request");
  if (!request.is_object()) throw DataError("a request that is not a JSON object");
  const std::string op = request.at("op").get<std::string>();
  if (op == "quorum") {
    return answer_quorum(request.at("group").get<std::int64_t>(),
                         request.at("incarnation").get<std::string>(),
                         request.at("step").get<std::int64_t>(),
                         request.at("timeout").get<double>(), request.value("fresh", false));
  }
  if (op == "get")
    return answer_get(request.at("key").get<std::string>(), request.at("timeout").get<double>());
  const std::lock_guard lock(mutex_);
  if (op == "join") {
    const RunShape shape{request.at("groups").get<std::int64_t>(),
                         request.at("min_groups").get<std::int64_t>(),
                         request.at("fingerprint").get<std::string>()};
    const auto group = request.at("group").get<std::int64_t>();
    const auto incarnation = request.at("incarnation").get<std::string>();
    state_.join(group, incarnation, shape, now(), connection.id);
    connection.group = group;
    connection.incarnation = incarnation;
    changed_.notify_all();
    return success();
  }
  if (op == "heartbeat") {
    const auto group = request.at("group").get<std::int64_t>();
    if (!state_.heartbeat(group, request.at("incarnation").get<std::string>(), now())) {
      return not_live(fmt::format(
          "replica group {} is not live (dropped after its heartbeat timeout, or replaced): it "
          "must join again",
          group));
    }
    return success();
  }
  if (op == "set") {
    store_[request.at("key").get<std::string>()] = request.at("value").get<std::string>();
    changed_.notify_all();
    return success();
  }
  if (op == "status")
    return success({{"live", state_.live()}, {"last_quorum", quorum_json(state_.last())}});
  return failure(fmt::format("unknown op '{}'", op));
}

std::string Coordinator::answer_quorum(std::int64_t group, const std::string& incarnation,
                                       std::int64_t step, double timeout, bool fresh) {
  std::unique_lock lock(mutex_);
  delivered_.erase(group);  // a quorum an earlier ask timed out on is stale
  if (!state_.ask(group, incarnation, step, now(), fresh)) {
    return not_live(
        fmt::format("replica group {} is not live: it must join again before it asks", group));
  }
  changed_.notify_all();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout);
  while (!stopping_) {
    if (const auto it = delivered_.find(group); it != delivered_.end()) {
      const Quorum quorum = it->second;
      delivered_.erase(it);
      return success({{"quorum", quorum_json(quorum)}});
    }
    if (std::optional<Quorum> formed = state_.form(now())) {
      formed->coordinator = incarnation_;
      for (const std::int64_t member : formed->members)
        delivered_[member] = *formed;
      changed_.notify_all();
      continue;
    }
    if (std::chrono::steady_clock::now() >= deadline) break;
    changed_.wait_for(lock, kPoll);
  }
  return failure(fmt::format("no quorum for step {} within {} s (live groups: {})", step, timeout,
                             fmt::join(state_.live(), ", ")));
}

std::string Coordinator::answer_get(const std::string& key, double timeout) {
  std::unique_lock lock(mutex_);
  const bool present = changed_.wait_for(lock, std::chrono::duration<double>(timeout),
                                         [&] { return stopping_ || store_.count(key) != 0; });
  if (!present || stopping_)
    return failure(fmt::format("key '{}' was not set within {} s", key, timeout));
  return success({{"value", store_.at(key)}});
}

void serve_until_signalled(const CoordinatorConfig& config, std::ostream& log) {
  sigset_t signals{};
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  Coordinator coordinator(config);
  coordinator.start();
  log << fmt::format(
             "meshtensor coordinator: listening on {}:{} (heartbeat timeout {} s, quorum wait {} "
             "s)",
             config.host, coordinator.port(), config.rules.heartbeat_timeout,
             config.rules.quorum_wait)
      << std::endl;
  int signal = 0;
  sigwait(&signals, &signal);
  coordinator.stop();
}

namespace {

/// The error of a refused request, as `Failure` naming the coordinator.
template <typename Failure>
Failure refused(const std::string& address, const Json& reply) {
  return Failure(fmt::format("coordinator {}: {}", address, reply.at("error").get<std::string>()));
}

void sleep_for(double seconds) {
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
}

}  // namespace

struct StoreClient::Link {
  LineSocket socket;
};

StoreClient::StoreClient(const std::string& address, double timeout)
    : address_(address), timeout_(timeout) {
  const auto [host, port] = parse_address(address);
  link_ = std::make_unique<Link>(Link{LineSocket::connect(host, port, timeout)});
}

StoreClient::~StoreClient() = default;

void StoreClient::set(const std::string& key, const std::string& value) {
  const std::lock_guard lock(mutex_);
  link_->socket.send_line(Json{{"op", "set"}, {"key", key}, {"value", value}}.dump());
  const Json reply = parse_reply(link_->socket.read_line(timeout_));
  if (!reply.at("ok").get<bool>()) throw refused<CommError>(address_, reply);
}

std::string StoreClient::get(const std::string& key, double timeout) {
  const std::lock_guard lock(mutex_);
  link_->socket.send_line(Json{{"op", "get"}, {"key", key}, {"timeout", timeout}}.dump());
  const Json reply = parse_reply(link_->socket.read_line(timeout + timeout_));
  if (!reply.at("ok").get<bool>()) throw refused<TimeoutError>(address_, reply);
  return reply.at("value").get<std::string>();
}

std::string StoreClient::local_host() {
  const std::lock_guard lock(mutex_);
  return link_->socket.local_host();
}

struct CoordinatorClient::Link {
  LineSocket socket;
};

CoordinatorClient::CoordinatorClient(const std::string& address, std::int64_t group,
                                     const RunShape& shape, double timeout)
    : address_(address),
      group_(group),
      shape_(shape),
      incarnation_(new_incarnation()),
      timeout_(timeout) {
  join(timeout);
  beater_ = std::thread([this] { beat(); });
}

CoordinatorClient::~CoordinatorClient() {
  {
    const std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  stop_.notify_all();
  if (beater_.joinable()) beater_.join();
}

void CoordinatorClient::join(double timeout) {
  const auto [host, port] = parse_address(address_);
  control_ = std::make_unique<Link>(Link{LineSocket::connect(host, port, timeout)});
  const Json join{{"op", "join"},
                  {"group", group_},
                  {"incarnation", incarnation_},
                  {"groups", shape_.groups},
                  {"min_groups", shape_.min_groups},
                  {"fingerprint", shape_.fingerprint}};
  const Json reply = parse_reply(request(join.dump(), timeout));
  if (!reply.at("ok").get<bool>()) {
    control_.reset();
    throw refused<DataError>(address_, reply);
  }
}

std::string CoordinatorClient::request(const std::string& line, double timeout) {
  const std::lock_guard lock(request_mutex_);
  if (!control_) throw CommError(fmt::format("coordinator {}: not connected", address_));
  control_->socket.send_line(line);
  return control_->socket.read_line(timeout);
}

std::string CoordinatorClient::local_host() {
  const std::lock_guard lock(request_mutex_);
  return control_ ? control_->socket.local_host() : std::string();
}

void CoordinatorClient::beat() {
  const Json beat{{"op", "heartbeat"}, {"group", group_}, {"incarnation", incarnation_}};
  const auto [host, port] = parse_address(address_);
  std::optional<LineSocket> link;
  std::unique_lock lock(mutex_);
  while (!stop_.wait_for(lock, std::chrono::milliseconds(500), [&] { return stopping_; })) {
    try {
      if (!link) link.emplace(LineSocket::connect(host, port, std::min(timeout_, 1.0)));
      link->send_line(beat.dump());
      link->read_line(timeout_);
    } catch (const CommError&) {
      link.reset();  // the coordinator is gone or restarting: connect again on the next beat
    }
  }
}

std::optional<Quorum> CoordinatorClient::try_quorum(std::int64_t step, double timeout, bool fresh) {
  const Json ask{{"op", "quorum"}, {"group", group_},    {"incarnation", incarnation_},
                 {"step", step},   {"timeout", timeout}, {"fresh", fresh}};
  for (int attempt = 0; attempt < 2; ++attempt) {
    Json reply;
    try {
      if (!control_) join(std::min(timeout_, 2.0));
      reply = parse_reply(request(ask.dump(), timeout + timeout_));
    } catch (const CommError& e) {  // gone, restarting, or not answering
      unreachable_ = e.what();
      control_.reset();
      return std::nullopt;
    }
    if (reply.at("ok").get<bool>()) return quorum_of(reply.at("quorum"));
    if (!reply.value("rejoin", false)) throw refused<TimeoutError>(address_, reply);
    control_.reset();  // dropped while silent: join again, then ask
  }
  unreachable_ = "it dropped this group again right after it joined";
  return std::nullopt;
}

Quorum CoordinatorClient::quorum(std::int64_t step, double timeout, bool fresh) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout);
  for (;;) {
    if (std::optional<Quorum> formed = try_quorum(step, timeout, fresh)) return *formed;
    if (std::chrono::steady_clock::now() >= deadline) break;
    sleep_for(0.2);
  }
  throw CommError(
      fmt::format("coordinator {} unreachable for {} s while replica group {} asked "
                  "for the quorum of step {}: {}",
                  address_, timeout, group_, step, unreachable_));
}

void CoordinatorClient::set(const std::string& key, const std::string& value) {
  const Json reply =
      parse_reply(request(Json{{"op", "set"}, {"key", key}, {"value", value}}.dump(), timeout_));
  if (!reply.at("ok").get<bool>()) throw refused<CommError>(address_, reply);
}

std::string CoordinatorClient::get(const std::string& key, double timeout) {
  const Json reply = parse_reply(
      request(Json{{"op", "get"}, {"key", key}, {"timeout", timeout}}.dump(), timeout + timeout_));
  if (!reply.at("ok").get<bool>()) throw refused<TimeoutError>(address_, reply);
  return reply.at("value").get<std::string>();
}

std::string quorum_text(const Quorum& quorum) {
  return quorum_json(quorum).dump();
}

Quorum parse_quorum(const std::string& text) {
  try {
    return quorum_of(parse_untrusted_json(text, "a quorum"));
  } catch (const Json::exception& e) {
    throw DataError(fmt::format("a quorum that is not one: {}", e.what()));
  }
}

}  // namespace meshtensor::ft
