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

std::vector<std::string> all_gather_text(Communicator& group, const std::string& text) {
  Tensor lengths({group.size()}, DType::i64);
  group.all_gather(Tensor::full({1}, DType::i64, static_cast<double>(text.size())), lengths);
  std::vector<std::int64_t> counts(lengths.values<std::int64_t>().begin(),
                                   lengths.values<std::int64_t>().end());
  std::int64_t total = 0;
  for (const std::int64_t count : counts)
    total += count;
  Tensor mine({static_cast<std::int64_t>(text.size())}, DType::u8);
  if (!text.empty()) std::memcpy(mine.bytes().data(), text.data(), text.size());
  Tensor all({total}, DType::u8);
  group.all_gather(mine, all, counts);
  std::vector<std::string> texts;
  const auto* bytes = reinterpret_cast<const char*>(std::as_const(all).bytes().data());
  for (const std::int64_t count : counts) {
    texts.emplace_back(bytes, static_cast<std::size_t>(count));
    bytes += count;
  }
  return texts;
}

namespace {

// The class of a failure as one letter, so that the other ranks can throw the same class.
char failure_class(const std::exception_ptr& failure) {
  try {
    std::rethrow_exception(failure);
  } catch (const ParseError&) {
    return 'P';
  } catch (const InvalidArgument&) {
    return 'I';
  } catch (const ResourceError&) {
    return 'R';
  } catch (const DataError&) {
    return 'D';
  } catch (const DesyncError&) {
    return 'S';
  } catch (const TimeoutError&) {
    return 'T';
  } catch (const CommError&) {
    return 'C';
  } catch (...) {
    return 'E';
  }
}

std::string failure_message(const std::exception_ptr& failure) {
  try {
    std::rethrow_exception(failure);
  } catch (const std::exception& error) {
    return error.what();
  } catch (...) {
    return "unknown failure";
  }
}

[[noreturn]] void throw_class(char kind, const std::string& message) {
  switch (kind) {
    case 'P':
      throw ParseError(message);
    case 'I':
      throw InvalidArgument(message);
    case 'R':
      throw ResourceError(message);
    case 'D':
      throw DataError(message);
    case 'S':
      throw DesyncError(message);
    case 'T':
      throw TimeoutError(message);
    case 'C':
      throw CommError(message);
    default:
      throw Error(message);
  }
}

}  // namespace

bool on_any_rank(Communicator& group, bool flag) {
  Tensor any = Tensor::full({1}, DType::i64, flag ? 1.0 : 0.0);
  group.all_reduce(any, {.op = ReduceOp::max, .mode = ReductionMode::ordered});
  return std::as_const(any).values<std::int64_t>()[0] != 0;
}

void throw_if_any_failed(Communicator& group, const std::exception_ptr& failure) {
  Tensor first = Tensor::full({1}, DType::i64, failure ? group.rank() : group.size());
  group.all_reduce(first, {.op = ReduceOp::min, .mode = ReductionMode::ordered});
  const auto root = static_cast<int>(std::as_const(first).values<std::int64_t>()[0]);
  if (root == group.size()) return;
  std::string text;
  if (group.rank() == root)
    text = std::string(1, failure_class(failure)) + failure_message(failure);
  text = broadcast_text(group, text, root);
  if (group.rank() == root) std::rethrow_exception(failure);
  throw_class(text.empty() ? 'E' : text[0], text.empty() ? text : text.substr(1));
}

}  // namespace meshtensor::comm
