#pragma once

// Element combine rules shared by the kernels (internal header).
#include <cmath>
#include <type_traits>

#include <meshtensor/core/dtype.hpp>
#include <meshtensor/core/reduce_op.hpp>
#include <meshtensor/kernels/elementwise.hpp>

namespace meshtensor::kernels::detail {

template <class T>
inline constexpr bool kIsHalf = std::is_same_v<T, Float16> || std::is_same_v<T, BFloat16>;

/// max/min with order-free NaN and signed-zero rules; `a` and `b` are ordered like their keys.
template <class T, class Key>
T order_free_extremum(T a, T b, Key key_a, Key key_b, bool want_max) {
  if (std::isnan(key_a) || std::isnan(key_b)) return canonical_nan<T>();
  if (key_a == key_b) {
    // Equal keys differ only for zeros: max prefers +0, min prefers -0.
    const bool a_negative = std::signbit(key_a);
    return (a_negative != want_max) ? a : b;
  }
  return ((key_a > key_b) == want_max) ? a : b;
}

/// a + b without NaN canonicalisation (integers wrap): for loops that canonicalise at the end.
template <class A>
A add_raw(A a, A b) {
  if constexpr (std::is_floating_point_v<A>) {
    return a + b;
  } else {
    using U = std::make_unsigned_t<A>;
    return static_cast<A>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
  }
}

/// op(a, b) for arithmetic types (floating or integer); sums of integers wrap, a NaN sum is the
/// canonical NaN.
template <class A>
A combine_arithmetic(A a, A b, ReduceOp op) {
  if constexpr (std::is_floating_point_v<A>) {
    if (op == ReduceOp::max || op == ReduceOp::min)
      return order_free_extremum(a, b, a, b, op == ReduceOp::max);
    const A sum = a + b;
    return sum != sum ? canonical_nan<A>() : sum;  // payload-free: the same NaN in any order
  } else {
    if (op == ReduceOp::max) return a > b ? a : b;
    if (op == ReduceOp::min) return a < b ? a : b;
    return add_raw(a, b);
  }
}

/// The type a reduction of T accumulates in.
template <class T>
using Accumulator = std::conditional_t<kIsHalf<T>, float, T>;

template <class T>
Accumulator<T> widen(T value) {
  if constexpr (kIsHalf<T>) {
    return to_float(value);
  } else {
    return value;
  }
}

}  // namespace meshtensor::kernels::detail
