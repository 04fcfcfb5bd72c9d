#include <algorithm>
#include <array>
#include <cstring>

#include <fmt/format.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/kernels/reduce.hpp>

#include "combine.hpp"

namespace meshtensor::kernels {

namespace {
constexpr std::size_t kBlockElements = 1024;

// Final value of an accumulator: avg divides once, then one rounding to T.
template <class T>
T finish(detail::Accumulator<T> acc, ReduceOp op, std::size_t inputs) {
  using A = detail::Accumulator<T>;
  if (op == ReduceOp::avg) {
    if constexpr (std::is_floating_point_v<T>) {
      return acc / static_cast<T>(inputs);
    } else if constexpr (detail::kIsHalf<T>) {
      return element_from_double<T>(static_cast<double>(acc) / static_cast<double>(inputs));
    } else {
      return element_from_double<T>(static_cast<double>(acc) / static_cast<double>(inputs));
    }
  }
  if constexpr (detail::kIsHalf<T>) {
    return element_from_double<T>(static_cast<double>(acc));
  } else {
    static_assert(std::is_same_v<A, T>);
    return acc;
  }
}

template <class T>
void reduce_typed(ReduceOp op, std::span<const std::byte* const> inputs,
                  std::span<std::byte* const> outputs, std::size_t count) {
  using A = detail::Accumulator<T>;
  std::array<A, kBlockElements> acc;
  std::array<T, kBlockElements> result;
  for (std::size_t begin = 0; begin < count; begin += kBlockElements) {
    const std::size_t n = std::min(kBlockElements, count - begin);
    const auto* first = reinterpret_cast<const T*>(inputs[0]) + begin;
    for (std::size_t i = 0; i < n; ++i)
      acc[i] = detail::widen(first[i]);
    for (std::size_t j = 1; j < inputs.size(); ++j) {
      const auto* in = reinterpret_cast<const T*>(inputs[j]) + begin;
      for (std::size_t i = 0; i < n; ++i)
        acc[i] = detail::combine_arithmetic<A>(acc[i], detail::widen(in[i]), op);
    }
    for (std::size_t i = 0; i < n; ++i)
      result[i] = finish<T>(acc[i], op, inputs.size());
    for (std::byte* out : outputs)
      std::memcpy(out + begin * sizeof(T), result.data(), n * sizeof(T));
  }
}
}  // namespace

void reduce_ordered(DType dtype, ReduceOp op, std::span<const std::byte* const> inputs,
                    std::span<std::byte* const> outputs, std::size_t count) {
  if (inputs.empty()) throw InvalidArgument("reduce_ordered needs at least one input");
  visit_dtype(dtype, [&](auto zero) { reduce_typed<decltype(zero)>(op, inputs, outputs, count); });
}

}  // namespace meshtensor::kernels
