#include <algorithm>
#include <utility>

#include <fmt/format.h>

#include <meshtensor/comm/peer.hpp>
#include <meshtensor/core/digest.hpp>
#include <meshtensor/core/error.hpp>

namespace meshtensor::comm {

namespace {

std::string link_text(const PeerLink& link) {
  return fmt::format("{} -> {} (tag {})", link.sender, link.receiver, link.tag);
}

/// What both ends of a message must agree on: dtype, element count and label.
std::array<std::int64_t, 3> message_header(const Tensor& tensor, const std::string& label) {
  Digest64 digest;
  digest.update(label);
  return {static_cast<std::int64_t>(tensor.dtype()), tensor.numel(),
          static_cast<std::int64_t>(digest.finish())};
}

}  // namespace

PeerChannels::PeerChannels(Communicator& group, std::vector<PeerLink> links,
                           const CollectiveOptions& options)
    : rank_(group.rank()),
      size_(group.size()),
      // The threads backend compares every call of a group; mpi only in check mode, so there a
      // header travels first.
      exchange_headers_(group.backend() != "threads" && !check_mode_from_environment()),
      timeout_(options.timeout),
      links_(std::move(links)) {
  for (std::size_t i = 0; i < links_.size(); ++i) {
    const PeerLink& link = links_[i];
    if (link.sender < 0 || link.sender >= size_ || link.receiver < 0 || link.receiver >= size_ ||
        link.sender == link.receiver) {
      throw InvalidArgument(fmt::format("peer link {} needs two different members of a group of {}",
                                        link_text(link), size_));
    }
    if (std::find(links_.begin(), links_.begin() + static_cast<std::ptrdiff_t>(i), link) !=
        links_.begin() + static_cast<std::ptrdiff_t>(i))
      throw InvalidArgument(fmt::format("peer link {} is given twice", link_text(link)));
  }
  for (const PeerLink& link : links_) {
    const bool end = rank_ == link.sender || rank_ == link.receiver;
    CollectiveOptions split_options = options;
    split_options.label = "peer link " + link_text(link);
    groups_.push_back(group.split(end ? 0 : -1, rank_ == link.sender ? 0 : 1, split_options));
    queues_.push_back(end ? std::make_unique<WorkQueue>() : nullptr);
  }
}

std::size_t PeerChannels::link_index(int sender, int receiver, std::int64_t tag,
                                     const char* what) const {
  const PeerLink wanted{sender, receiver, tag};
  const auto found = std::find(links_.begin(), links_.end(), wanted);
  if (found == links_.end()) {
    throw InvalidArgument(
        fmt::format("{} on link {}: no such link was declared", what, link_text(wanted)));
  }
  return static_cast<std::size_t>(found - links_.begin());
}

void PeerChannels::transfer(std::size_t link, const Tensor& tensor,
                            const std::string& label) const {
  Communicator& group = *groups_[link];
  CollectiveOptions options;
  options.timeout = timeout_;
  options.label = label;
  if (exchange_headers_) {
    const auto mine = message_header(tensor, label);
    Tensor both(Shape{2, 3}, DType::i64);
    Tensor own(Shape{3}, DType::i64);
    std::copy(mine.begin(), mine.end(), own.values<std::int64_t>().begin());
    group.all_gather(own, both, {}, options);
    const auto h = both.values<std::int64_t>();
    if (!std::equal(h.begin(), h.begin() + 3, h.begin() + 3)) {
      const PeerLink& ends = links_[link];
      throw DesyncError(fmt::format(
          "mismatched point-to-point pair on link {}: the sender sends {} {} elements, the "
          "receiver expects {} {} elements{}",
          link_text(ends), dtype_name(static_cast<DType>(h[0])), h[1],
          dtype_name(static_cast<DType>(h[3])), h[4],
          h[2] != h[5] ? fmt::format(" (this rank's message is '{}', the other's differs)", label)
                       : std::string()));
    }
  }
  group.broadcast(tensor, 0, options);
}

Work PeerChannels::post(const Tensor& tensor, int peer, std::int64_t tag, bool sending,
                        std::string label, bool blocking) {
  const char* what = sending ? "send" : "recv";
  if (!tensor.defined() || !tensor.is_contiguous()) {
    throw InvalidArgument(fmt::format(
        "{} '{}' to/from {}: the tensor must be defined and contiguous", what, label, peer));
  }
  const std::size_t link =
      sending ? link_index(rank_, peer, tag, what) : link_index(peer, rank_, tag, what);
  if (label.empty()) label = fmt::format("p2p {}", link_text(links_[link]));
  if (blocking) {
    queues_[link]->run([this, link, &tensor, &label] { transfer(link, tensor, label); });
    return {};
  }
  return queues_[link]->submit(
      [this, link, tensor, label = std::move(label)] { transfer(link, tensor, label); });
}

Work PeerChannels::isend(const Tensor& tensor, int peer, std::int64_t tag, std::string label) {
  return post(tensor, peer, tag, true, std::move(label), false);
}

Work PeerChannels::irecv(const Tensor& tensor, int peer, std::int64_t tag, std::string label) {
  return post(tensor, peer, tag, false, std::move(label), false);
}

void PeerChannels::send(const Tensor& tensor, int peer, std::int64_t tag, std::string label) {
  post(tensor, peer, tag, true, std::move(label), true);
}

void PeerChannels::recv(const Tensor& tensor, int peer, std::int64_t tag, std::string label) {
  post(tensor, peer, tag, false, std::move(label), true);
}

std::vector<Work> PeerChannels::batch_isend_irecv(const std::vector<PeerOp>& ops) {
  std::vector<Work> works;
  works.reserve(ops.size());
  for (const PeerOp& op : ops) {
    works.push_back(op.kind == PeerOp::Kind::send ? isend(op.tensor, op.peer, op.tag, op.label)
                                                  : irecv(op.tensor, op.peer, op.tag, op.label));
  }
  return works;
}

}  // namespace meshtensor::comm
