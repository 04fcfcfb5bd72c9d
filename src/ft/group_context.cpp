#include <algorithm>
#include <chrono>
#include <csignal>
#include <exception>
#include <gloo/allgather.h>
#include <gloo/allgatherv.h>
#include <gloo/allreduce.h>
#include <gloo/alltoallv.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/logging.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <meshtensor/core/base64.hpp>
#include <meshtensor/core/error.hpp>
#include <meshtensor/ft/group_context.hpp>

namespace meshtensor::ft {

namespace {

std::chrono::milliseconds milliseconds(double seconds) {
  return std::chrono::milliseconds(static_cast<std::int64_t>(seconds * 1000.0));
}

/// Gloo's rendezvous through the coordinator's store, every key under `prefix`.
class CoordinatorStore : public gloo::rendezvous::Store {
 public:
  CoordinatorStore(StoreClient& coordinator, std::string prefix, double timeout)
      : coordinator_(coordinator), prefix_(std::move(prefix)), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    coordinator_.set(prefix_ + key, base64_encode(std::string_view(data.data(), data.size())));
  }

  std::vector<char> get(const std::string& key) override {
    const std::string bytes =
        base64_decode(coordinator_.get(prefix_ + key, timeout_), "a rendezvous value");
    return {bytes.begin(), bytes.end()};
  }

  void wait(const std::vector<std::string>& keys) override { wait(keys, milliseconds(timeout_)); }

  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    for (const std::string& key : keys)
      coordinator_.get(prefix_ + key, static_cast<double>(timeout.count()) / 1000.0);
  }

 private:
  StoreClient& coordinator_;
  std::string prefix_;
  double timeout_;
};

}  // namespace

template <typename Operation>
void GroupContext::guarded(const char* what, Operation operation) {
  if (!context_) {
    throw CommError(fmt::format("{} on the spent context of quorum {}: ask for a new quorum", what,
                                quorum_.id));
  }
  try {
    operation();
  } catch (const std::exception& e) {
    context_.reset();  // a failed Gloo context is never used again
    throw CommError(fmt::format("{} over replica groups {} (quorum {}, {}) failed: {}", what,
                                fmt::join(quorum_.members, ", "), quorum_.id, tag_, e.what()));
  }
}

GroupContext::GroupContext(const std::string& coordinator, std::int64_t group, const Quorum& quorum,
                           const std::string& tag, const std::string& hostname, double timeout)
    : quorum_(quorum), tag_(tag), timeout_(timeout) {
  // Gloo writes to its peers' sockets with writev: a peer that died would end this process with
  // SIGPIPE instead of failing the operation (Python, torch's host, ignores it by default).
  ::signal(SIGPIPE, SIG_IGN);
  const auto me = std::find(quorum.members.begin(), quorum.members.end(), group);
  if (me == quorum.members.end()) {
    throw InvalidArgument(fmt::format("replica group {} is not a member of quorum {} ({})", group,
                                      quorum.id, fmt::join(quorum.members, ", ")));
  }
  rank_ = static_cast<int>(me - quorum.members.begin());
  size_ = static_cast<int>(quorum.members.size());
  gloo::transport::tcp::attr attr;
  attr.hostname = hostname;
  auto context = std::make_shared<gloo::rendezvous::Context>(rank_, size_);
  context->setTimeout(milliseconds(timeout));
  context_ = context;
  guarded("meeting", [&] {
    StoreClient client(coordinator, timeout);
    CoordinatorStore store(client, fmt::format("quorum/{}/{}/", quorum.id, tag), timeout);
    std::shared_ptr<gloo::transport::Device> device = gloo::transport::tcp::CreateDevice(attr);
    context->connectFullMesh(store, device);
  });
}

GroupContext::~GroupContext() = default;

void GroupContext::all_reduce_sum(std::span<std::int64_t> values) {
  guarded("all-reduce", [&] {
    gloo::AllreduceOptions options(context_);
    options.setOutput(values.data(), values.size());
    options.setReduceFunction([](void* out, const void* a, const void* b, std::size_t n) {
      auto* o = static_cast<std::int64_t*>(out);
      const auto* x = static_cast<const std::int64_t*>(a);
      const auto* y = static_cast<const std::int64_t*>(b);
      for (std::size_t i = 0; i < n; ++i)
        o[i] = x[i] + y[i];
    });
    options.setTimeout(milliseconds(timeout_));
    gloo::allreduce(options);
  });
}

void GroupContext::broadcast(std::span<char> bytes, int root) {
  // In pieces, each within the timeout: a whole model's state takes many.
  constexpr std::size_t kPiece = std::size_t{32} << 20;
  for (std::size_t first = 0; first < bytes.size() || first == 0; first += kPiece) {
    const std::span<char> piece = bytes.subspan(first, std::min(kPiece, bytes.size() - first));
    guarded("broadcast", [&] {
      gloo::BroadcastOptions options(context_);
      options.setOutput(piece.data(), piece.size());
      options.setRoot(root);
      options.setTimeout(milliseconds(timeout_));
      gloo::broadcast(options);
    });
    if (bytes.empty()) break;
  }
}

std::vector<char> GroupContext::all_gather(std::span<const char> bytes) {
  std::vector<char> all(bytes.size() * static_cast<std::size_t>(size_));
  guarded("all-gather", [&] {
    gloo::AllgatherOptions options(context_);
    options.setInput(const_cast<char*>(bytes.data()), bytes.size());
    options.setOutput(all.data(), all.size());
    options.setTimeout(milliseconds(timeout_));
    gloo::allgather(options);
  });
  return all;
}

void GroupContext::all_gather_bytes(std::span<const char> input, std::span<char> output,
                                    const std::vector<std::int64_t>& counts) {
  guarded("all-gather", [&] {
    gloo::AllgathervOptions options(context_);
    options.setInput(const_cast<char*>(input.data()), input.size());
    options.setOutput(output.data(), std::vector<std::size_t>(counts.begin(), counts.end()));
    options.setTimeout(milliseconds(timeout_));
    gloo::allgatherv(options);
  });
}

void GroupContext::all_to_all_bytes(std::span<const char> input,
                                    const std::vector<std::int64_t>& send_counts,
                                    std::span<char> output,
                                    const std::vector<std::int64_t>& recv_counts) {
  guarded("all-to-all", [&] {
    gloo::AlltoallvOptions options(context_);
    options.setInput(const_cast<char*>(input.data()), send_counts);
    options.setOutput(output.data(), recv_counts);
    options.setTimeout(milliseconds(timeout_));
    gloo::alltoallv(options);
  });
}

void GroupContext::barrier() {
  guarded("barrier", [&] {
    gloo::BarrierOptions options(context_);
    options.setTimeout(milliseconds(timeout_));
    gloo::barrier(options);
  });
}

}  // namespace meshtensor::ft
