#include <algorithm>
#include <array>
#include <cstring>
#include <vector>

#include <fmt/format.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <meshtensor/core/error.hpp>
#include <meshtensor/kernels/elementwise.hpp>
#include <meshtensor/kernels/reduce.hpp>

#include "combine.hpp"
#include "simd_dispatch.hpp"

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

// Sum (or mean) of one block of every input, in input order, into `result`. A sum that is NaN
// becomes the canonical NaN: which operand's payload the hardware passes on depends on operand
// order, and vectorised and scalar code order them differently. Every loop is branch-free per
// element, so it vectorises; the accumulator stays in L1.
template <class T>
[[gnu::always_inline]] inline void sum_block_body(const T* const* in, std::size_t k, std::size_t n,
                                                  bool mean, T* result) {
  using A = detail::Accumulator<T>;
  if constexpr (std::is_same_v<A, T> && std::is_floating_point_v<T>) {
    // f32/f64: the first two inputs and the last one are fused into the passes around the
    // middle ones, so a two-input sum is a single pass.
    const T nan = canonical_nan<T>();
    const auto divisor = static_cast<T>(k);
    const auto finish = [&](T value) {
      if (mean) value = value / divisor;
      return value != value ? nan : value;
    };
    if (k == 1) {
      for (std::size_t i = 0; i < n; ++i)
        result[i] = finish(in[0][i]);
      return;
    }
    const T* first = in[0];
    const T* last = in[k - 1];
    if (k == 2) {
      for (std::size_t i = 0; i < n; ++i)
        result[i] = finish(first[i] + last[i]);
      return;
    }
    T acc[kBlockElements];
    const T* second = in[1];
    for (std::size_t i = 0; i < n; ++i)
      acc[i] = first[i] + second[i];
    // The middle inputs up to four per pass (still added one after the other).
    std::size_t j = 2;
    for (; j + 4 < k; j += 4) {
      const T* a = in[j];
      const T* b = in[j + 1];
      const T* c = in[j + 2];
      const T* d = in[j + 3];
      for (std::size_t i = 0; i < n; ++i)
        acc[i] = (((acc[i] + a[i]) + b[i]) + c[i]) + d[i];
    }
    for (; j + 1 < k; ++j) {
      const T* add = in[j];
      for (std::size_t i = 0; i < n; ++i)
        acc[i] += add[i];
    }
    for (std::size_t i = 0; i < n; ++i)
      result[i] = finish(acc[i] + last[i]);
  } else {
    A acc[kBlockElements];
    for (std::size_t i = 0; i < n; ++i)
      acc[i] = detail::widen(in[0][i]);
    for (std::size_t j = 1; j < k; ++j) {
      const T* add = in[j];
      for (std::size_t i = 0; i < n; ++i)
        acc[i] = detail::add_raw<A>(acc[i], detail::widen(add[i]));
    }
    if constexpr (std::is_integral_v<T>) {
      if (!mean) {
        std::copy(acc, acc + n, result);
        return;
      }
      for (std::size_t i = 0; i < n; ++i)
        result[i] = element_from_double<T>(static_cast<double>(acc[i]) / static_cast<double>(k));
    } else {
      // Halves: the f32 sum rounds once to the half (a mean: the f32 sum over k, in f64).
      for (std::size_t i = 0; i < n; ++i) {
        const double value = mean ? static_cast<double>(acc[i]) / static_cast<double>(k)
                                  : static_cast<double>(acc[i]);
        result[i] = acc[i] != acc[i] ? canonical_nan<T>() : element_from_double<T>(value);
      }
    }
  }
}
MESHTENSOR_SIMD_KERNEL(sum_block, sum_block_body)

// Max or min of one block of every input, in input order, into `result`.
template <class T>
void extremum_block(const T* const* in, std::size_t k, std::size_t n, ReduceOp op, T* result) {
  using A = detail::Accumulator<T>;
  for (std::size_t i = 0; i < n; ++i) {
    if constexpr (detail::kIsHalf<T>) {
      T best = in[0][i];
      for (std::size_t j = 1; j < k; ++j) {
        best = detail::order_free_extremum(best, in[j][i], to_float(best), to_float(in[j][i]),
                                           op == ReduceOp::max);
      }
      result[i] = best;
    } else {
      A best = in[0][i];
      for (std::size_t j = 1; j < k; ++j)
        best = detail::combine_arithmetic<A>(best, in[j][i], op);
      result[i] = best;
    }
  }
}

// out = first + second (a mean: over 2), NaN canonical, where `out` may be `first` or `second`
// itself: each form reads and writes through one pointer, so the compiler vectorises it without
// a run-time overlap check (which an exact alias would fail). One pass, no staging block.
template <class T>
[[gnu::always_inline]] inline void add_pair_body(const T* first, const T* second, T* out,
                                                 std::size_t n, bool mean) {
  const T nan = canonical_nan<T>();
  const T scale = mean ? T(0.5) : T(1);  // x / 2 and x * 0.5 round alike
  const auto finish = [&](T value) {
    value = value * scale;
    return value != value ? nan : value;
  };
  if (out == first) {
    for (std::size_t i = 0; i < n; ++i)
      out[i] = finish(out[i] + second[i]);
  } else if (out == second) {
    for (std::size_t i = 0; i < n; ++i)
      out[i] = finish(first[i] + out[i]);
  } else {
    for (std::size_t i = 0; i < n; ++i)
      out[i] = finish(first[i] + second[i]);
  }
}
MESHTENSOR_SIMD_KERNEL(add_pair, add_pair_body)

template <class T>
void reduce_typed(ReduceOp op, std::span<const std::byte* const> inputs,
                  std::span<std::byte* const> outputs, std::size_t count) {
  const bool streaming = count * sizeof(T) >= kStreamingBytes;
  if constexpr (std::is_floating_point_v<T>) {
    // Two inputs into one output (the owner's reduction of a 2-rank group): one pass.
    if (inputs.size() == 2 && outputs.size() == 1 && !streaming &&
        (op == ReduceOp::sum || op == ReduceOp::avg)) {
      add_pair<T>(reinterpret_cast<const T*>(inputs[0]), reinterpret_cast<const T*>(inputs[1]),
                  reinterpret_cast<T*>(outputs[0]), count, op == ReduceOp::avg);
      return;
    }
  }
  T result[kBlockElements];
  std::vector<const T*> block(inputs.size());
  for (std::size_t begin = 0; begin < count; begin += kBlockElements) {
    const std::size_t n = std::min(kBlockElements, count - begin);
    for (std::size_t j = 0; j < block.size(); ++j)
      block[j] = reinterpret_cast<const T*>(inputs[j]) + begin;
    if (op == ReduceOp::sum || op == ReduceOp::avg) {
      sum_block<T>(block.data(), block.size(), n, op == ReduceOp::avg, result);
    } else {
      extremum_block<T>(block.data(), block.size(), n, op, result);
    }
    for (std::byte* out : outputs) {
      store_block(out + begin * sizeof(T), reinterpret_cast<const std::byte*>(result),
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
