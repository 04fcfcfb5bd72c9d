#pragma once

// Pieces the f32 and bf16 matmul kernels share (internal header): where a tile's chains start,
// edge tiles run through a full-size copy, and a register transpose for packing.

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

namespace meshtensor::kernels {

/// Where each element's chain of a product starts: c's old value, the bias of its column (a row
/// of n values shared by every row), or +0.
template <class T>
struct Seed {
  bool accumulate = false;
  const T* bias = nullptr;

  /// The starting values of the tile at (row0, col0) of c (row stride ldc) and their row stride;
  /// null for +0.
  std::pair<const T*, std::int64_t> at(const T* c, std::int64_t ldc, std::int64_t row0,
                                       std::int64_t col0) const {
    if (accumulate) return {c + row0 * ldc + col0, ldc};
    if (bias != nullptr) return {bias + col0, 0};
    return {nullptr, 0};
  }
};

/// Runs `run` on the edge tile of `rows` x `cols` at `tile` through a full mr x nr copy in `edge`
/// (padded rows and columns are independent), its chains starting from `init` (null: +0).
template <class T, class Run>
void run_on_edge(Run run, std::vector<T>& edge, std::int64_t nr, std::int64_t rows,
                 std::int64_t cols, T* tile, std::int64_t ldc,
                 std::pair<const T*, std::int64_t> init) {
  std::fill(edge.begin(), edge.end(), T{0});
  if (init.first != nullptr)
    for (std::int64_t r = 0; r < rows; ++r)
      std::copy_n(init.first + r * init.second, cols, edge.data() + r * nr);
  run(edge.data(), init.first != nullptr ? edge.data() : nullptr);
  for (std::int64_t r = 0; r < rows; ++r)
    std::copy_n(edge.data() + r * nr, cols, tile + r * ldc);
}

#if defined(__x86_64__) && defined(__GNUC__)
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
#endif

}  // namespace meshtensor::kernels
