#include <fmt/format.h>

#include <meshtensor/core/enum_names.hpp>
#include <meshtensor/core/reduce_op.hpp>

namespace meshtensor {

namespace {
constexpr EnumName<ReduceOp> kReduceOpNames[] = {
    {ReduceOp::sum, "sum"}, {ReduceOp::avg, "avg"}, {ReduceOp::max, "max"}, {ReduceOp::min, "min"}};
}  // namespace

std::string_view reduce_op_name(ReduceOp op) {
  return enum_name(kReduceOpNames, op, "reduce op");
}

ReduceOp parse_reduce_op(std::string_view text) {
  return parse_enum(kReduceOpNames, text, "reduce op");
}

}  // namespace meshtensor
