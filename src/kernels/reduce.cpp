#include <algorithm>
#include <array>
#include <cstring>

#include <fmt/format.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <meshtensor/core/error.hpp>
#include <meshtensor/kernels/elementwise.hpp>
#include <meshtensor/kernels/reduce.hpp>

#include "combine.hpp"

namespace meshtensor::kernels {

namespace {
constexpr std::size_t kBlockElements = 1024;
// Outputs at least this large bypass the caches: the result is not read again soon, and
// streaming stores save the read a normal store of an uncached line costs.
constexpr std::size_t kStreamingBytes = std::size_t{4} << 20;

// Copies a block to an output; with `streaming`, through non-temporal stores where available.
void store_block(std::byte* out, const std::byte* from, std::size_t bytes, bool streaming) {
#if defined(__x86_64__)
  if (streaming) {
    const auto address = reinterpret_cast<std::uintptr_t>(out);
    std::size_t head = (16 - address % 16) % 16;
    head = std::min(head, bytes);
    std::memcpy(out, from, head);
    std::size_t at = head;
    for (; at + 16 <= bytes; at += 16) {
      _mm_stream_si128(reinterpret_cast<__m128i*>(out + at),
                       _mm_loadu_si128(reinterpret_cast<const __m128i*>(from + at)));
    }
    std::memcpy(out + at, from + at, bytes - at);
    return;
  }
#endif
  (void)streaming;
  std::memcpy(out, from, bytes);
}

// Makes streaming stores visible before the caller signals other threads.
void finish_streaming(bool streaming) {
#if defined(__x86_64__)
  if (streaming) _mm_sfence();
#endif
  (void)streaming;
}

// Final value of an accumulator: avg divides once, then one rounding to T. A sum that is NaN
// becomes the canonical NaN: which operand's payload the hardware passes on depends on operand
// order, and vectorised and scalar code order them differently.
template <class T>
T finish(detail::Accumulator<T> acc, ReduceOp op, std::size_t inputs) {
  using A = detail::Accumulator<T>;
  if constexpr (!std::is_integral_v<A>) {
    if (acc != acc) return canonical_nan<T>();
  }
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
  const bool streaming = count * sizeof(T) >= kStreamingBytes;
  for (std::size_t begin = 0; begin < count; begin += kBlockElements) {
    const std::size_t n = std::min(kBlockElements, count - begin);
    const auto* first = reinterpret_cast<const T*>(inputs[0]) + begin;
    for (std::size_t i = 0; i < n; ++i)
      acc[i] = detail::widen(first[i]);
    for (std::size_t j = 1; j < inputs.size(); ++j) {
      const auto* in = reinterpret_cast<const T*>(inputs[j]) + begin;
      if (op == ReduceOp::sum || op == ReduceOp::avg) {
        // The common case without a per-element branch, so it vectorises; finish() makes a NaN
        // canonical.
        for (std::size_t i = 0; i < n; ++i)
          acc[i] = detail::add_raw<A>(acc[i], detail::widen(in[i]));
      } else {
        for (std::size_t i = 0; i < n; ++i)
          acc[i] = detail::combine_arithmetic<A>(acc[i], detail::widen(in[i]), op);
      }
    }
    for (std::size_t i = 0; i < n; ++i)
      result[i] = finish<T>(acc[i], op, inputs.size());
    for (std::byte* out : outputs) {
      store_block(out + begin * sizeof(T), reinterpret_cast<const std::byte*>(result.data()),
                  n * sizeof(T), streaming);
    }
  }
  finish_streaming(streaming);
}
}  // namespace

void reduce_ordered(DType dtype, ReduceOp op, std::span<const std::byte* const> inputs,
                    std::span<std::byte* const> outputs, std::size_t count) {
  if (inputs.empty()) throw InvalidArgument("reduce_ordered needs at least one input");
  visit_dtype(dtype, [&](auto zero) { reduce_typed<decltype(zero)>(op, inputs, outputs, count); });
}

}  // namespace meshtensor::kernels
