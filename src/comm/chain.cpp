#include <algorithm>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <meshtensor/comm/chain.hpp>
#include <meshtensor/core/error.hpp>
#include <meshtensor/kernels/fixed_point.hpp>

namespace meshtensor::comm {

namespace {
CollectiveOptions primitive_options(ReduceOp op) {
  CollectiveOptions options;
  options.op = op;
  options.mode = ReductionMode::ordered;  // integer sums and max are exact in any order
  return options;
}

}  // namespace

namespace {

/// "2,4,8" for the groups' sizes; the first 16 and a count of the rest for longer chains.
std::string group_sizes(std::span<Communicator* const> groups) {
  std::vector<std::int64_t> sizes;
  for (Communicator* group : groups)
    sizes.push_back(group->size());
  return list_excerpt(sizes);
}

}  // namespace

void all_reduce_chain(std::span<Communicator* const> groups, const Tensor& buffer,
                      const CollectiveOptions& options) {
  CollectiveCall call = describe_all_reduce(buffer, options, 1);
  if (!(options.mode == ReductionMode::exact && uses_fixed_point(call))) {
    for (Communicator* group : groups)
      group->all_reduce(buffer, options);
    return;
  }
  // Counted without overflow: a chain may name more groups than an int64 product can hold.
  std::int64_t addends = 1;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    const int size = groups[g]->size();
    if (addends > kernels::kMaxExactAddends / size) {
      // addends <= the limit and size fits an int: the product fits 64 bits.
      throw InvalidArgument(fmt::format(
          "all_reduce_chain: an exact reduction over {} groups has more addends per element "
          "than the limit of {}: the first {} (sizes [{}]) already give {}",
          groups.size(), kernels::kMaxExactAddends, g + 1, group_sizes(groups.first(g + 1)),
          addends * size));
    }
    addends *= size;
  }

  const Tensor values = buffer.flatten();
  Tensor keys({values.numel()}, DType::u8);
  kernels::fixed_point_keys(values, keys);
  CollectiveOptions step_options = primitive_options(ReduceOp::max);
  step_options.timeout = options.timeout;
  for (Communicator* group : groups)
    group->all_reduce(keys, step_options);

  Tensor fixed({values.numel() * kernels::fixed_point_format(call.dtype).limbs}, DType::i64);
  kernels::encode_fixed_point(values, keys, fixed);
  step_options.op = ReduceOp::sum;
  for (Communicator* group : groups)
    group->all_reduce(fixed, step_options);
  kernels::decode_fixed_point(fixed, keys, options.op == ReduceOp::avg ? addends : 1, values);
}

}  // namespace meshtensor::comm
