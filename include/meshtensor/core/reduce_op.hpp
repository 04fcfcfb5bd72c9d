#pragma once

#include <cstdint>
#include <string_view>

namespace meshtensor {

/// How values from several ranks combine. `avg` sums and divides once at the end.
enum class ReduceOp : std::uint8_t { sum, avg, max, min };

/// "sum", "avg", "max" or "min".
std::string_view reduce_op_name(ReduceOp op);
/// Parses a reduce op name; throws ParseError naming the token.
ReduceOp parse_reduce_op(std::string_view text);

}  // namespace meshtensor
