#include <fmt/format.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/mesh/placement.hpp>

namespace meshtensor {

Placement Placement::shard(int tensor_dim) {
  if (tensor_dim < 0) throw InvalidArgument(fmt::format("shard dim {} is negative", tensor_dim));
  return {Kind::shard, tensor_dim, ReduceOp::sum};
}

Placement Placement::replicate() {
  return {Kind::replicate, -1, ReduceOp::sum};
}

Placement Placement::partial(ReduceOp op) {
  return {Kind::partial, -1, op};
}

int Placement::shard_dim() const {
  if (!is_shard()) throw InvalidArgument(fmt::format("{} is not a Shard placement", to_string()));
  return shard_dim_;
}

ReduceOp Placement::reduce_op() const {
  if (!is_partial())
    throw InvalidArgument(fmt::format("{} is not a Partial placement", to_string()));
  return op_;
}

std::string Placement::to_string() const {
  switch (kind_) {
    case Kind::shard:
      return fmt::format("S{}", shard_dim_);
    case Kind::replicate:
      return "R";
    case Kind::partial:
      return fmt::format("P({})", reduce_op_name(op_));
  }
  return "?";
}

}  // namespace meshtensor
