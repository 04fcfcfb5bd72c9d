#pragma once

// Compiles one kernel body for every SimdLevel and calls the one in use (internal header).
//
//   MESHTENSOR_SIMD_KERNEL(name, body): `body` is a function template <class T> marked
//   [[gnu::always_inline]]; `name<T>(args...)` then runs it compiled for simd_level().
// The body is inlined into one function per level, each built with that level's target flags,
// so the compiler vectorises it as wide as the level allows; the source, and so the bits, are
// the same.
#include <utility>

#include <meshtensor/kernels/simd.hpp>

#if defined(__x86_64__) && defined(__GNUC__)
#define MESHTENSOR_SIMD_KERNEL(name, body)                                                 \
  template <class T, class... Args>                                                        \
  [[gnu::target("avx512f,avx512dq,avx512bw,avx512vl")]] auto name##_avx512(Args... args) { \
    return body<T>(args...);                                                               \
  }                                                                                        \
  template <class T, class... Args>                                                        \
  [[gnu::target("avx2")]] auto name##_avx2(Args... args) {                                 \
    return body<T>(args...);                                                               \
  }                                                                                        \
  template <class T, class... Args>                                                        \
  auto name##_baseline(Args... args) {                                                     \
    return body<T>(args...);                                                               \
  }                                                                                        \
  template <class T, class... Args>                                                        \
  auto name(Args... args) {                                                                \
    switch (::meshtensor::kernels::simd_level()) {                                         \
      case ::meshtensor::kernels::SimdLevel::avx512:                                       \
        return name##_avx512<T>(args...);                                                  \
      case ::meshtensor::kernels::SimdLevel::avx2:                                         \
        return name##_avx2<T>(args...);                                                    \
      default:                                                                             \
        return name##_baseline<T>(args...);                                                \
    }                                                                                      \
  }
#else
#define MESHTENSOR_SIMD_KERNEL(name, body) \
  template <class T, class... Args>        \
  auto name(Args... args) {                \
    return body<T>(args...);               \
  }
#endif
