#include <algorithm>
#include <bit>
#include <cstring>

#include <fmt/format.h>

#include <meshtensor/comm/agree.hpp>
#include <meshtensor/core/digest.hpp>
#include <meshtensor/core/error.hpp>

namespace meshtensor::comm {

namespace {
// Longest text a broadcast carries (longer texts are cut).
constexpr std::int64_t kMaxTextBytes = 4096;
}  // namespace

std::string broadcast_text(Communicator& group, const std::string& text, int root) {
  Tensor buffer = Tensor::zeros({kMaxTextBytes}, DType::u8);
  if (group.rank() == root) {
    std::memcpy(buffer.bytes().data(), text.data(),
                std::min<std::size_t>(text.size(), kMaxTextBytes - 1));
  }
  group.broadcast(buffer, root);
  return std::string(reinterpret_cast<const char*>(buffer.bytes().data()));
}

void check_same_on_every_rank(Communicator& group, std::string_view what, const std::string& text) {
  Digest64 digest;
  digest.update(text);
  const auto mine = std::bit_cast<std::int64_t>(digest.finish());
  // max(h) and max(~h) = ~min(h) in one call: equal everywhere iff max(h) == min(h).
  Tensor extremes = Tensor::zeros({2}, DType::i64);
  extremes.values<std::int64_t>()[0] = mine;
  extremes.values<std::int64_t>()[1] = ~mine;
  group.all_reduce(extremes, {.op = ReduceOp::max, .mode = ReductionMode::ordered});
  const auto seen = std::as_const(extremes).values<std::int64_t>();
  if (seen[0] == ~seen[1]) return;
  Tensor all({group.size()}, DType::i64);
  Tensor own = Tensor::full({1}, DType::i64, 0);
  own.values<std::int64_t>()[0] = mine;
  group.all_gather(own, all);
  const auto digests = std::as_const(all).values<std::int64_t>();
  int differs = 1;
  while (differs < group.size() && digests[static_cast<std::size_t>(differs)] == digests[0])
    ++differs;
  const std::string first = broadcast_text(group, text, 0);
  const std::string other = broadcast_text(group, text, differs);
  throw InvalidArgument(
      fmt::format("the ranks disagree on {}: world rank {} has '{}', but world rank {} has '{}'",
                  what, group.world_ranks()[0], first,
                  group.world_ranks()[static_cast<std::size_t>(differs)], other));
}

}  // namespace meshtensor::comm
