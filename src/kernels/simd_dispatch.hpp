#pragma once

// Compiles one kernel body for every SimdLevel and calls the one in use (internal header).
//
//   MESHTENSOR_SIMD_KERNEL(name, body): `body` is a function template <class T> marked
//   [[gnu::always_inline]]; `name<T>(args...)` then runs it compiled for simd_level().
//   MESHTENSOR_LANES_KERNEL(name, body): `body` is a function template <int W> marked
//   [[gnu::always_inline]] that works on f32 vectors of W lanes (lanes.hpp); `name(args...)`
//   runs it with the widest W of simd_level() (16, 8 or 4).
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
#define MESHTENSOR_LANES_KERNEL(name, body)                                                \
  template <class... Args>                                                                 \
  [[gnu::target("avx512f,avx512dq,avx512bw,avx512vl")]] void name##_avx512(Args... args) { \
    body<16>(args...);                                                                     \
  }                                                                                        \
  template <class... Args>                                                                 \
  [[gnu::target("avx2")]] void name##_avx2(Args... args) {                                 \
    body<8>(args...);                                                                      \
  }                                                                                        \
  template <class... Args>                                                                 \
  void name##_baseline(Args... args) {                                                     \
    body<4>(args...);                                                                      \
  }                                                                                        \
  template <class... Args>                                                                 \
  void name(Args... args) {                                                                \
    switch (::meshtensor::kernels::simd_level()) {                                         \
      case ::meshtensor::kernels::SimdLevel::avx512:                                       \
        return name##_avx512(args...);                                                     \
      case ::meshtensor::kernels::SimdLevel::avx2:                                         \
        return name##_avx2(args...);                                                       \
      default:                                                                             \
        return name##_baseline(args...);                                                   \
    }                                                                                      \
  }
#else
#define MESHTENSOR_LANES_KERNEL(name, body) \
  template <class... Args>                  \
  void name(Args... args) {                 \
    body<4>(args...);                       \
  }
#define MESHTENSOR_SIMD_KERNEL(name, body) \
  template <class T, class... Args>        \
  auto name(Args... args) {                \
    return body<T>(args...);               \
  }
#endif
