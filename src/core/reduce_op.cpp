#include <fmt/format.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/core/reduce_op.hpp>

namespace meshtensor {

std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return "sum";
    case ReduceOp::avg:
      return "avg";
    case ReduceOp::max:
      return "max";
    case ReduceOp::min:
      return "min";
  }
  throw InvalidArgument(fmt::format("invalid reduce op value {}", static_cast<int>(op)));
}

ReduceOp parse_reduce_op(std::string_view text) {
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min}) {
    if (reduce_op_name(op) == text) return op;
  }
  throw ParseError(fmt::format("unknown reduce op '{}': expected sum, avg, max or min", text));
}

}  // namespace meshtensor
