#pragma once

// Register transposes the matmul packers share (internal header).

#include <cstdint>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

namespace meshtensor::kernels {

/// out[c·ld + r] = src[r·stride + c] for r, c < 8: one 8 x 8 block transposed in registers.
[[gnu::target("avx2"), gnu::always_inline]] inline void transpose_8x8(const float* src,
                                                                      std::int64_t stride,
                                                                      float* out, std::int64_t ld) {
  __m256 row[8];
  for (int i = 0; i < 8; ++i)
    row[i] = _mm256_loadu_ps(src + i * stride);
  __m256 pair[8];
  for (int i = 0; i < 8; i += 2) {
    pair[i] = _mm256_unpacklo_ps(row[i], row[i + 1]);
    pair[i + 1] = _mm256_unpackhi_ps(row[i], row[i + 1]);
  }
  __m256 quad[8];
  for (int i = 0; i < 8; i += 4) {
    quad[i] = _mm256_shuffle_ps(pair[i], pair[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    quad[i + 1] = _mm256_shuffle_ps(pair[i], pair[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    quad[i + 2] = _mm256_shuffle_ps(pair[i + 1], pair[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    quad[i + 3] = _mm256_shuffle_ps(pair[i + 1], pair[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int i = 0; i < 4; ++i) {
    _mm256_storeu_ps(out + i * ld, _mm256_permute2f128_ps(quad[i], quad[i + 4], 0x20));
    _mm256_storeu_ps(out + (i + 4) * ld, _mm256_permute2f128_ps(quad[i], quad[i + 4], 0x31));
  }
}

}  // namespace meshtensor::kernels
#endif
