#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <vector>

#include <fmt/format.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/core/half.hpp>
#include <meshtensor/core/profile.hpp>
#include <meshtensor/kernels/binned_sum.hpp>
#include <meshtensor/kernels/elementwise.hpp>

#include "simd_dispatch.hpp"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

namespace meshtensor::kernels {

BinnedSums::BinnedSums(std::int64_t count)
    : bins(Tensor::full(Shape{count}, DType::i32, kLowestBin)),
      digits(Tensor::zeros(Shape{3, count}, DType::f64)) {}

BinnedSums BinnedSums::uninitialized(std::int64_t count) {
  BinnedSums sums;
  sums.bins = Tensor::uninitialized(Shape{count}, DType::i32);
  sums.digits = Tensor::uninitialized(Shape{3, count}, DType::f64);
  return sums;
}

BinnedSums::BinnedSums(const BinnedSums& other)
    : bins(other.bins.clone()), digits(other.digits.clone()) {}

BinnedSums& BinnedSums::operator=(const BinnedSums& other) {
  if (this != &other) {
    bins = other.bins.clone();
    digits = other.digits.clone();
  }
  return *this;
}

void BinnedSums::clear() {
  bins.fill(kLowestBin);
  digits.fill(0.0);
}

void BinnedSums::clear(std::int64_t offset, std::int64_t length) {
  if (offset < 0 || length < 0 || offset > count() - length) {
    throw InvalidArgument(fmt::format("BinnedSums::clear: elements [{}, {}) are outside its {}",
                                      offset, offset + length, count()));
  }
  bins.narrow(0, offset, length).fill(kLowestBin);
  digits.narrow(1, offset, length).fill(0.0);
}

namespace {

__extension__ using Int128 = __int128;
__extension__ using UInt128 = unsigned __int128;

constexpr int kBinBits = 32;

/// Bound code of zero: far enough below any other that a sum with it stays below every bin.
constexpr std::int32_t kZeroCode = -(1 << 20);
/// Bound code of infinities and NaN: a sum with it (even with kZeroCode) is past every bin.
constexpr std::int32_t kNonFiniteCode = 1 << 24;

/// The smallest c with |v| < 2^c (kZeroCode for zero, kNonFiniteCode for infinities and NaN), so
/// that |a * b| < 2^(code(a) + code(b)).
inline std::int32_t bound_code(double v) {
  const std::uint64_t bits = std::bit_cast<std::uint64_t>(v) & ~(std::uint64_t{1} << 63);
  const auto biased = static_cast<std::int32_t>(bits >> 52);
  // Selects, not branches: zeros come at random (ReLU, blank pixels) and loops vectorise.
  const std::int32_t finite = bits == 0 ? kZeroCode : std::max(biased, 1) - 1022;  // subnormals
  return biased == 0x7ff ? kNonFiniteCode : finite;                                // are < 2^-1022
}

/// The bin of addends bounded by 2^code: the smallest b (at least kLowestBin) with
/// 2^code <= 2^(32b - 1), so every addend is below half the window's top; kNonFiniteBin past
/// the last.
inline std::int32_t bin_of_bound(std::int32_t code) {
  constexpr std::int32_t kLastBin = kNonFiniteBin - 1;
  if (code > kBinBits * kLastBin - 1) return kNonFiniteBin;
  if (code < kBinBits * kLowestBin) return kLowestBin;
  const std::int32_t n = code + 1;  // ceil(n / 32)
  return n >= 0 ? (n + kBinBits - 1) / kBinBits : -(-n / kBinBits);
}

/// Moves element i's digits up by `shift` bins (the lowest `shift` digits drop out; nothing for
/// shift <= 0). Written with selects, not branches, so that loops over elements vectorise.
inline void shift_digits(double* d0, double* d1, double* d2, std::int64_t i, std::int32_t shift) {
  const double low = d0[i];
  const double middle = d1[i];
  const double high = d2[i];
  const bool keep = shift <= 0;
  d0[i] = keep ? low : shift == 1 ? middle : shift == 2 ? high : 0.0;
  d1[i] = keep ? middle : shift == 1 ? high : 0.0;
  d2[i] = keep ? high : 0.0;
}

/// Columns one pass of the kernel keeps in registers.
constexpr std::int64_t kColumnBlock = 16;

/// The state of the accumulator elements one block of columns adds into.
struct BlockTarget {
  std::int32_t* bins;
  double* d0;
  double* d1;
  double* d2;
  bool empty;  ///< whether to ignore what the elements hold (Start::empty)
};

/// The addends' first factors, one per term: a[t] multiplies row index[t] of a packed block.
struct Terms {
  const double* a;
  const std::int32_t* codes;  ///< bound_code(a[t])
  const std::int32_t* index;
  std::int64_t count;
};

/// One block of columns of the packed second factors, row after row (see PackedRows).
struct RowBlock {
  const double* values;
  const std::int32_t* codes;
};

/// The largest bound code (a sum of the factors' codes) of each column's products: one integer
/// add and maximum per product. Written with vector types: as a plain loop the compiler
/// vectorises this maximum across rows (gathers) instead of across the block's columns.
[[gnu::always_inline]] inline void largest_codes(Terms terms, RowBlock block,
                                                 std::int32_t (&out)[kColumnBlock]) {
  using ColumnCodes = std::int32_t __attribute__((vector_size(kColumnBlock * 4)));
  constexpr std::int64_t kChains = 4;  // independent maxima: one chain waits on its latency
  ColumnCodes largest[kChains];
  for (ColumnCodes& chain : largest)
    chain = ColumnCodes{} + 2 * kZeroCode;  // below every sum of two codes
  const auto take = [&](ColumnCodes& running, std::int64_t t) {
    ColumnCodes row;
    std::memcpy(&row, block.codes + std::int64_t{terms.index[t]} * kColumnBlock, sizeof row);
    const ColumnCodes bound = row + terms.codes[t];
    running = bound > running ? bound : running;
  };
  std::int64_t t = 0;
  for (; t + kChains <= terms.count; t += kChains)
    for (std::int64_t c = 0; c < kChains; ++c)
      take(largest[c], t + c);
  for (; t < terms.count; ++t)
    take(largest[0], t);
  for (std::int64_t c = 1; c < kChains; ++c)
    largest[0] = largest[c] > largest[0] ? largest[c] : largest[0];
  std::memcpy(out, &largest[0], sizeof out);
}

/// One block's elements while the kernel works on them: bins and digit sums in digit units.
struct BlockState {
  std::int32_t bins[kColumnBlock];
  double d0[kColumnBlock];
  double d1[kColumnBlock];
  double d2[kColumnBlock];
};

/// The block's state to add to: `needed` and no digits for an empty target, else the target's
/// with each bin raised to at least needed[j], dropping the digits below each new window.
[[gnu::always_inline]] inline void start_block(BlockState& state, const BlockTarget& target,
                                               const std::int32_t (&needed)[kColumnBlock]) {
  if (target.empty) {
    for (std::int64_t j = 0; j < kColumnBlock; ++j) {
      state.bins[j] = needed[j];
      state.d0[j] = state.d1[j] = state.d2[j] = 0.0;
    }
    return;
  }
  std::memcpy(state.bins, target.bins, sizeof state.bins);
  std::memcpy(state.d0, target.d0, sizeof state.d0);
  std::memcpy(state.d1, target.d1, sizeof state.d1);
  std::memcpy(state.d2, target.d2, sizeof state.d2);
  std::int32_t moved = 0;
  for (std::int64_t j = 0; j < kColumnBlock; ++j)
    moved |= needed[j] > state.bins[j] ? 1 : 0;
  if (moved == 0) return;  // the common case once the first addends have set the bins
  for (std::int64_t j = 0; j < kColumnBlock; ++j) {
    const std::int32_t bin = std::max(needed[j], state.bins[j]);
    shift_digits(state.d0, state.d1, state.d2, j, bin - state.bins[j]);
    state.bins[j] = bin;
  }
}

/// Writes a block's state back with plain stores.
struct PlainStores {
  [[gnu::always_inline]] static void write(const BlockTarget& target, const BlockState& state) {
    std::memcpy(target.bins, state.bins, sizeof state.bins);
    std::memcpy(target.d0, state.d0, sizeof state.d0);
    std::memcpy(target.d1, state.d1, sizeof state.d1);
    std::memcpy(target.d2, state.d2, sizeof state.d2);
  }
};

/// a * b + c rounded once: fused where the level has the instruction, else multiplied and added
/// (the same bits when a * b is exact, as every product of f32 factors is in f64).
template <bool kFused>
[[gnu::always_inline]] inline double multiply_add(double a, double b, double c) {
  if constexpr (kFused) {
    return __builtin_fma(a, b, c);
  } else {
    return a * b + c;
  }
}

/// Adds sum over t of a[t] * row index[t] into the kColumnBlock elements of one block of
/// columns. First the largest bound of each column's products raises its bin; then every
/// product drops its three window digits into the digit sums. Each digit is the nearest multiple
/// of its unit (ties to even) of what the digits above left, taken with the magic-constant
/// rounding (x + C) - C, C = 1.5 * 2^52 * unit: one add and one subtract, the rounding a function
/// of x and the unit alone. The remainders are exact, and an addend below half the window's top
/// contributes the same upper digits to a window one or more bins higher, so dropping the lowest
/// digits when a bin rises gives exactly the digits of the higher window.
template <bool kFused>
[[gnu::always_inline]] inline void add_block_body(Terms terms, RowBlock block, BlockTarget target,
                                                  BlockState& state) {
  std::int32_t needed[kColumnBlock];
  largest_codes(terms, block, needed);
  for (std::int64_t j = 0; j < kColumnBlock; ++j)  // ceil((code + 1) / 32), clamped
    needed[j] = std::clamp((needed[j] + kBinBits) >> 5, kLowestBin, kNonFiniteBin);
  start_block(state, target, needed);
  // Digit units 2^(top - 32), 2^(top - 64), 2^(top - 96) (top = 32 * bin) and the constants
  // 1.5 * 2^52 * unit, built from their exponent fields.
  std::int64_t exponent[kColumnBlock];
  for (std::int64_t j = 0; j < kColumnBlock; ++j)
    exponent[j] = std::int64_t{kBinBits} * state.bins[j] + 1023;
  double magic2[kColumnBlock];
  double magic1[kColumnBlock];
  double magic0[kColumnBlock];
  double unit2[kColumnBlock];
  double unit1[kColumnBlock];
  const auto powers = [&](double(&out)[kColumnBlock], std::int64_t add, std::int64_t sign) {
    std::int64_t bits[kColumnBlock];
    for (std::int64_t j = 0; j < kColumnBlock; ++j)
      bits[j] = (sign * (exponent[j] - 1023) + add + 1023) << 52;
    std::memcpy(out, bits, sizeof out);
  };
  powers(magic2, 52 - 32, 1);
  powers(magic1, 52 - 64, 1);
  powers(magic0, 52 - 96, 1);
  powers(unit2, 32, -1);
  powers(unit1, 64, -1);
  for (std::int64_t j = 0; j < kColumnBlock; ++j) {
    magic2[j] *= 1.5;
    magic1[j] *= 1.5;
    magic0[j] *= 1.5;
  }
  // The lowest digit is summed as the bit patterns of x + C: for |x| < 2^51 units, x + C keeps
  // C's exponent and its bits are C's plus the digit in units, so wrapping integer sums of them
  // minus count * bits(C) are the digit sums exactly, one operation per digit fewer.
  double acc2[kColumnBlock] = {};
  double acc1[kColumnBlock] = {};
  std::uint64_t acc0[kColumnBlock] = {};
  for (std::int64_t t = 0; t < terms.count; ++t) {
    const double at = terms.a[t];
    const double* row = block.values + std::int64_t{terms.index[t]} * kColumnBlock;
    for (std::int64_t j = 0; j < kColumnBlock; ++j) {
      // The product is exact (f32 factors), so a fused multiply-add rounds it as x + C does.
      const double digit2 = multiply_add<kFused>(at, row[j], magic2[j]) - magic2[j];
      const double rest2 = multiply_add<kFused>(at, row[j], -digit2);
      const double digit1 = (rest2 + magic1[j]) - magic1[j];
      const double rest1 = rest2 - digit1;
      acc2[j] += digit2;
      acc1[j] += digit1;
      acc0[j] += std::bit_cast<std::uint64_t>(rest1 + magic0[j]);
    }
  }
  // Exact: integers below 2^53 in units. Non-finite elements keep no digits (their sum is NaN).
  for (std::int64_t j = 0; j < kColumnBlock; ++j) {
    const auto units0 =
        static_cast<std::int64_t>(acc0[j] - static_cast<std::uint64_t>(terms.count) *
                                                std::bit_cast<std::uint64_t>(magic0[j]));
    const bool finite = state.bins[j] != kNonFiniteBin;
    state.d2[j] = finite ? state.d2[j] + acc2[j] * unit2[j] : 0.0;
    state.d1[j] = finite ? state.d1[j] + acc1[j] * unit1[j] : 0.0;
    state.d0[j] = finite ? state.d0[j] + static_cast<double>(units0) : 0.0;
  }
}

void add_block_baseline(Terms terms, RowBlock block, BlockTarget target) {
  BlockState state;
  add_block_body<false>(terms, block, target, state);
  PlainStores::write(target, state);
}

#if defined(__x86_64__) && defined(__GNUC__)
/// Whether a block's state may go out with streaming stores of `bytes`-wide vectors: only to a
/// fresh (empty) target, whose lines need not be read before they are overwritten (the sums are
/// many megabytes, written once per step), and only where every plane is aligned for them.
bool streams(const BlockTarget& target, std::uintptr_t bytes) {
  const auto aligned = [&](const void* p) {
    return reinterpret_cast<std::uintptr_t>(p) % bytes == 0;
  };
  return target.empty && aligned(target.bins) && aligned(target.d0) && aligned(target.d1) &&
         aligned(target.d2);
}

#define MESHTENSOR_STREAMING_STORES(Name, target_flags, Vector, load, stream)                      \
  struct Name {                                                                                    \
    [[gnu::always_inline, gnu::target(target_flags)]] static void copy(void* to, const void* from, \
                                                                       std::size_t bytes) {        \
      for (std::size_t at = 0; at < bytes; at += sizeof(Vector)) {                                 \
        stream(reinterpret_cast<Vector*>(static_cast<std::byte*>(to) + at),                        \
               load(reinterpret_cast<const Vector*>(static_cast<const std::byte*>(from) + at)));   \
      }                                                                                            \
    }                                                                                              \
    [[gnu::always_inline, gnu::target(target_flags)]] static void write(const BlockTarget& target, \
                                                                        const BlockState& state) { \
      if (!streams(target, sizeof(Vector))) return PlainStores::write(target, state);              \
      copy(target.bins, state.bins, sizeof state.bins);                                            \
      copy(target.d0, state.d0, sizeof state.d0);                                                  \
      copy(target.d1, state.d1, sizeof state.d1);                                                  \
      copy(target.d2, state.d2, sizeof state.d2);                                                  \
    }                                                                                              \
  };
MESHTENSOR_STREAMING_STORES(Avx512Stores, "avx512f", __m512i, _mm512_loadu_si512,
                            _mm512_stream_si512)
MESHTENSOR_STREAMING_STORES(Avx2Stores, "avx2", __m256i, _mm256_loadu_si256, _mm256_stream_si256)
#undef MESHTENSOR_STREAMING_STORES

[[gnu::target("avx512f,avx512dq,avx512bw,avx512vl,fma")]] void add_block_avx512(
    Terms terms, RowBlock block, BlockTarget target) {
  BlockState state;
  add_block_body<true>(terms, block, target, state);
  Avx512Stores::write(target, state);
}
[[gnu::target("avx2,fma")]] void add_block_avx2(Terms terms, RowBlock block, BlockTarget target) {
  BlockState state;
  add_block_body<true>(terms, block, target, state);
  Avx2Stores::write(target, state);
}
void add_block(Terms terms, RowBlock block, BlockTarget target) {
  switch (simd_level()) {
    case SimdLevel::avx512:
      return add_block_avx512(terms, block, target);
    case SimdLevel::avx2:
      return add_block_avx2(terms, block, target);
    default:
      return add_block_baseline(terms, block, target);
  }
}
/// Orders the streaming stores before whatever follows (another thread may read the sums next).
void finish_streaming_stores() {
  _mm_sfence();
}
#else
void add_block(Terms terms, RowBlock block, BlockTarget target) {
  add_block_baseline(terms, block, target);
}
void finish_streaming_stores() {}
#endif

struct Planes {
  std::int32_t* bins;
  double* d0;
  double* d1;
  double* d2;
};

Planes planes_of(BinnedSums& sums) {
  const std::int64_t count = sums.count();
  double* digits = sums.digits.values<double>().data();
  return {sums.bins.values<std::int32_t>().data(), digits, digits + count, digits + 2 * count};
}

/// Storage that calls on one thread reuse (grown when a call needs more, kept until the thread
/// ends): the packed operands of the kernels below are rebuilt every training step, and fresh
/// allocations of that size would map and fault in new pages each time. `Slot` tells apart the
/// buffers one call uses at once. Contents are left uninitialised.
template <class T, int Slot>
T* thread_buffer(std::size_t count) {
  thread_local std::unique_ptr<T[]> buffer;
  thread_local std::size_t capacity = 0;
  if (count > capacity) {
    buffer.reset();  // the old one goes first: peak memory is the new size only
    buffer.reset(new T[count]);
    capacity = count;
  }
  return buffer.get();
}

/// The rows [rows, n] of addend factors as f64 column blocks: block b holds columns
/// b * kColumnBlock onwards of every row, row after row (zero-padded past n), so one pass over a
/// block reads contiguous memory and runs full-width vectors; with each value's bound code.
struct PackedRows {
  double* values;  // this thread's buffers, written whole by pack_column_blocks
  std::int32_t* codes;
  std::int64_t rows = 0;

  RowBlock block(std::int64_t first_column) const {
    const auto at = static_cast<std::size_t>((first_column / kColumnBlock) * rows * kColumnBlock);
    return {values + at, codes + at};
  }
};

/// codes[i] = bound_code(values[i]).
template <class T>
[[gnu::always_inline]] inline void bound_codes_body(const double* values, std::int32_t* codes,
                                                    std::int64_t count) {
  for (std::int64_t i = 0; i < count; ++i)
    codes[i] = bound_code(values[i]);
}
MESHTENSOR_SIMD_KERNEL(bound_codes, bound_codes_body)

template <class T>
PackedRows pack_column_blocks(const T* values, std::int64_t rows, std::int64_t n) {
  const std::int64_t blocks = (n + kColumnBlock - 1) / kColumnBlock;
  const auto size = static_cast<std::size_t>(blocks * rows * kColumnBlock);
  PackedRows packed{thread_buffer<double, 0>(size), thread_buffer<std::int32_t, 0>(size), rows};
  double* out = packed.values;
  for (std::int64_t block = 0; block < blocks; ++block) {
    const std::int64_t first = block * kColumnBlock;
    const std::int64_t width = std::min(kColumnBlock, n - first);
    for (std::int64_t r = 0; r < rows; ++r, out += kColumnBlock) {
      const T* row = values + r * n + first;
      for (std::int64_t j = 0; j < kColumnBlock; ++j)
        out[j] = j < width ? static_cast<double>(row[j < width ? j : 0]) : 0.0;
    }
  }
  bound_codes<void>(static_cast<const double*>(packed.values), packed.codes,
                    static_cast<std::int64_t>(size));
  return packed;
}

/// The first factors of every output row: list i holds the terms of row i of the result (a row
/// of the packed second factors and the value it is multiplied by), `capacity` slots apart.
struct TermLists {
  // This thread's buffers; slots past a list's count are never read.
  double* a;
  std::int32_t* codes;
  std::int32_t* index;
  std::vector<std::int64_t> counts;
  std::int64_t capacity = 0;

  TermLists(std::int64_t lists, std::int64_t list_capacity)
      : a(thread_buffer<double, 1>(static_cast<std::size_t>(lists * list_capacity))),
        codes(thread_buffer<std::int32_t, 1>(static_cast<std::size_t>(lists * list_capacity))),
        index(thread_buffer<std::int32_t, 2>(static_cast<std::size_t>(lists * list_capacity))),
        counts(static_cast<std::size_t>(lists), 0),
        capacity(list_capacity) {}
  /// Appends the term (value, row) to `list` when `keep`: the slot is written either way, so
  /// that loops over many terms run without branches (a list never holds more than `capacity`).
  void add(std::int64_t list, double value, std::int64_t row, bool keep = true) {
    auto& count = counts[static_cast<std::size_t>(list)];
    const auto slot = static_cast<std::size_t>(list * capacity + count);
    a[slot] = value;
    codes[slot] = bound_code(value);
    index[slot] = static_cast<std::int32_t>(row);
    count += keep ? 1 : 0;
  }
  /// Every list i holds every row in order with its value x[r][i] (`x` f32 [rows, lists]): the
  /// lists when no term is skipped, copied a tile of rows at a time and coded in one SIMD pass.
  void fill_all(const float* x, std::int64_t rows, std::int64_t lists) {
    constexpr std::int64_t kTile = 64;
    for (std::int64_t r0 = 0; r0 < rows; r0 += kTile) {
      const std::int64_t height = std::min(kTile, rows - r0);
      for (std::int64_t i = 0; i < lists; ++i) {
        double* values = a + i * capacity + r0;
        std::int32_t* rows_of = index + i * capacity + r0;
        for (std::int64_t r = 0; r < height; ++r) {
          values[r] = x[(r0 + r) * lists + i];  // f32 to f64: exact
          rows_of[r] = static_cast<std::int32_t>(r0 + r);
        }
      }
    }
    for (std::int64_t i = 0; i < lists; ++i) {
      counts[static_cast<std::size_t>(i)] = rows;
      bound_codes<void>(static_cast<const double*>(a + i * capacity), codes + i * capacity, rows);
    }
  }
  Terms terms(std::int64_t list) const {
    const auto at = static_cast<std::size_t>(list * capacity);
    return {a + at, codes + at, index + at, counts[static_cast<std::size_t>(list)]};
  }
};

/// add_block for the first `width` (< kColumnBlock) elements from `at`, through a full block
/// whose padding columns (zeros in the packed rows) are thrown away.
void add_partial_block(Planes planes, std::int64_t at, std::int64_t width, Terms terms,
                       RowBlock block, Start start) {
  std::int32_t bins[kColumnBlock];
  double d0[kColumnBlock];
  double d1[kColumnBlock];
  double d2[kColumnBlock];
  for (std::int64_t j = 0; j < kColumnBlock; ++j) {
    const bool used = j < width && start == Start::sums;
    bins[j] = used ? planes.bins[at + j] : kLowestBin;
    d0[j] = used ? planes.d0[at + j] : 0.0;
    d1[j] = used ? planes.d1[at + j] : 0.0;
    d2[j] = used ? planes.d2[at + j] : 0.0;
  }
  add_block(terms, block, BlockTarget{bins, d0, d1, d2, false});
  for (std::int64_t j = 0; j < width; ++j) {
    planes.bins[at + j] = bins[j];
    planes.d0[at + j] = d0[j];
    planes.d1[at + j] = d1[j];
    planes.d2[at + j] = d2[j];
  }
}

/// Element offset + i * n + j of `sums` += sum over the terms t of list i of a[t] * (row
/// index[t], column j of `packed`), every product exact in f64. Column blocks run outermost so
/// each stays in the L1 cache while every list multiplies it.
void add_term_lists(Planes planes, std::int64_t offset, const TermLists& lists, std::int64_t n,
                    const PackedRows& packed, Start start) {
  const auto m = static_cast<std::int64_t>(lists.counts.size());
  for (std::int64_t j0 = 0; j0 < n; j0 += kColumnBlock) {
    const RowBlock block = packed.block(j0);
    for (std::int64_t i = 0; i < m; ++i) {
      const Terms terms = lists.terms(i);
      if (terms.count == 0 && start == Start::sums) continue;
      const std::int64_t at = offset + i * n + j0;
      const std::int64_t width = std::min(kColumnBlock, n - j0);
      if (width == kColumnBlock) {
        add_block(terms, block,
                  BlockTarget{planes.bins + at, planes.d0 + at, planes.d1 + at, planes.d2 + at,
                              start == Start::empty});
      } else {
        add_partial_block(planes, at, width, terms, block, start);
      }
    }
  }
  finish_streaming_stores();
}

void check_rows_matrix(const Tensor& t, const char* what, const char* operation) {
  if (t.rank() != 2 || (t.dtype() != DType::f32 && t.dtype() != DType::f64)) {
    throw InvalidArgument(fmt::format("{}: {} must be a 2-D f32 or f64 tensor, got {} {}",
                                      operation, what, dtype_name(t.dtype()),
                                      t.shape().to_string()));
  }
  if (t.shape()[0] > kMaxBinnedAddends) {
    throw InvalidArgument(fmt::format("{}: {} has {} rows, more addends than an element holds ({})",
                                      operation, what, t.shape()[0], kMaxBinnedAddends));
  }
}

void check_count(const BinnedSums& sums, std::int64_t expected, const char* operation) {
  if (sums.count() != expected) {
    throw InvalidArgument(fmt::format("{}: the accumulator holds {} elements, the inputs make {}",
                                      operation, sums.count(), expected));
  }
}

void check_range(const BinnedSums& sums, std::int64_t offset, std::int64_t length,
                 const char* operation) {
  if (offset < 0 || length > sums.count() || offset > sums.count() - length) {
    throw InvalidArgument(fmt::format("{}: elements [{}, {}) are outside the accumulator's {}",
                                      operation, offset, offset + length, sums.count()));
  }
}

void check_f32(const Tensor& t, const char* what, const char* operation) {
  if (t.dtype() != DType::f32) {
    throw InvalidArgument(fmt::format("{}: {} must be f32 (its products are exact in f64), got {}",
                                      operation, what, dtype_name(t.dtype())));
  }
}

}  // namespace

void add_outer_products(BinnedSums& sums, std::int64_t offset, const Tensor& x, const Tensor& dy,
                        Start start) {
  const ProfileScope profile(ProfileRow::exact_sums);
  const char* operation = "add_outer_products";
  check_rows_matrix(x, "x", operation);
  check_rows_matrix(dy, "dy", operation);
  check_f32(x, "x", operation);
  check_f32(dy, "dy", operation);
  if (x.shape()[0] != dy.shape()[0]) {
    throw InvalidArgument(
        fmt::format("{}: x has {} rows, dy {}", operation, x.shape()[0], dy.shape()[0]));
  }
  const std::int64_t rows = x.shape()[0];
  const std::int64_t m = x.shape()[1];
  const std::int64_t n = dy.shape()[1];
  check_range(sums, offset, m * n, operation);
  const Tensor x_dense = x.contiguous();
  const auto xs = x_dense.values<float>();
  const Tensor dy_dense = dy.contiguous();
  const PackedRows packed = pack_column_blocks(dy_dense.values<float>().data(), rows, n);
  // 0 * inf is NaN here as in every other sum: rows where x is zero are skipped (ReLU, blank
  // pixels: they add nothing) only when dy holds no infinity or NaN.
  const auto dys = dy_dense.values<float>();
  bool dy_finite = true;
  for (const float v : dys)
    dy_finite = dy_finite && v - v == 0.0f;  // false for infinities and NaN
  bool x_has_zero = false;
  for (const float v : xs)
    x_has_zero = x_has_zero || v == 0.0f;
  TermLists lists(m, rows);
  if (!x_has_zero || !dy_finite) {  // every term is kept
    lists.fill_all(xs.data(), rows, m);
    add_term_lists(planes_of(sums), offset, lists, n, packed, start);
    return;
  }
  // A few lists at a time, row after row: x is read along its rows and each list's slots are
  // written in order.
  constexpr std::int64_t kListTile = 16;
  for (std::int64_t i0 = 0; i0 < m; i0 += kListTile) {
    const std::int64_t width = std::min(kListTile, m - i0);
    for (std::int64_t r = 0; r < rows; ++r) {
      const float* row = xs.data() + r * m + i0;
      for (std::int64_t k = 0; k < width; ++k)
        lists.add(i0 + k, row[k], r, row[k] != 0.0f || !dy_finite);  // f32 to f64: exact
    }
  }
  add_term_lists(planes_of(sums), offset, lists, n, packed, start);
}

void add_column_products(BinnedSums& sums, std::int64_t offset, const Tensor& a, const Tensor& b,
                         Start start) {
  const ProfileScope profile(ProfileRow::exact_sums);
  const char* operation = "add_column_products";
  check_rows_matrix(a, "a", operation);
  check_rows_matrix(b, "b", operation);
  check_f32(a, "a", operation);
  check_f32(b, "b", operation);
  if (a.shape() != b.shape()) {
    throw InvalidArgument(
        fmt::format("{}: a is {}, b {}", operation, a.shape().to_string(), b.shape().to_string()));
  }
  Tensor products = convert(a, DType::f64);
  const Tensor b64 = convert(b, DType::f64);
  auto values = products.values<double>();
  const auto bs = b64.values<double>();
  for (std::size_t i = 0; i < values.size(); ++i)
    values[i] *= bs[i];  // exact: f32 products
  add_column_sums(sums, offset, products, start);
}

void add_column_sums(BinnedSums& sums, std::int64_t offset, const Tensor& a, Start start) {
  const ProfileScope profile(ProfileRow::exact_sums);
  const char* operation = "add_column_sums";
  check_rows_matrix(a, "a", operation);
  const std::int64_t rows = a.shape()[0];
  const std::int64_t n = a.shape()[1];
  check_range(sums, offset, n, operation);
  const Tensor dense = a.contiguous();
  const PackedRows packed = dense.dtype() == DType::f64
                                ? pack_column_blocks(dense.values<double>().data(), rows, n)
                                : pack_column_blocks(dense.values<float>().data(), rows, n);
  TermLists ones(1, rows);
  for (std::int64_t r = 0; r < rows; ++r)
    ones.add(0, 1.0, r);
  add_term_lists(planes_of(sums), offset, ones, n, packed, start);
}

namespace {

/// Moves element i of `planes` to bin `bin` (at least its own), dropping the digits below the new
/// window; InvalidArgument for a bin outside the valid range or below the element's.
inline void raise_bin(Planes planes, std::int64_t i, std::int32_t bin, const char* operation) {
  const std::int32_t current = planes.bins[i];
  if (bin == current) return;
  if (bin < current || bin > kNonFiniteBin) {
    throw InvalidArgument(
        fmt::format("{}: element {} cannot move from bin {} to {}", operation, i, current, bin));
  }
  shift_digits(planes.d0, planes.d1, planes.d2, i, bin - current);
  planes.bins[i] = bin;
}

/// Runs of elements align_bins checks and moves together.
constexpr std::int64_t kAlignRun = 16;

/// align_bins over whole runs from `first` on: returns where it stopped, the first run holding
/// an element whose target is below its bin or past kNonFiniteBin (untouched, for raise_bin to
/// name), else the end of the last whole run. Written with selects so that each run is checked
/// and moved in a few vector operations; runs already in their bins are only read.
template <class T>
[[gnu::always_inline]] inline std::int64_t align_runs_body(Planes planes,
                                                           const std::int32_t* target,
                                                           std::int64_t first, std::int64_t count) {
  for (; first + kAlignRun <= count; first += kAlignRun) {
    std::int32_t moved = 0;
    std::int32_t invalid = 0;
    for (std::int64_t i = first; i < first + kAlignRun; ++i) {
      moved |= planes.bins[i] ^ target[i];
      invalid |= (target[i] < planes.bins[i]) | (target[i] > kNonFiniteBin);
    }
    if (moved == 0) continue;  // most runs already sit in their bins
    if (invalid != 0) return first;
    for (std::int64_t i = first; i < first + kAlignRun; ++i) {
      shift_digits(planes.d0, planes.d1, planes.d2, i, target[i] - planes.bins[i]);
      planes.bins[i] = target[i];
    }
  }
  return first;
}
MESHTENSOR_SIMD_KERNEL(align_runs, align_runs_body)

}  // namespace

void align_bins(BinnedSums& sums, const Tensor& bins) {
  if (bins.dtype() != DType::i32 || bins.numel() != sums.count()) {
    throw InvalidArgument(fmt::format("align_bins needs {} i32 bins, got {} {}", sums.count(),
                                      bins.numel(), dtype_name(bins.dtype())));
  }
  const Planes planes = planes_of(sums);
  const std::int32_t* target = bins.values<std::int32_t>().data();
  const std::int64_t count = sums.count();
  // Whole runs stop early only at an invalid target; raise_bin then names it.
  const std::int64_t first = align_runs<void>(planes, target, std::int64_t{0}, count);
  for (std::int64_t i = first; i < count; ++i)
    raise_bin(planes, i, target[i], "align_bins");
}

void merge_binned_sums(BinnedSums& sums, BinnedSums& other) {
  const ProfileScope profile(ProfileRow::exact_sums);
  check_count(sums, other.count(), "merge_binned_sums");
  const Planes mine = planes_of(sums);
  const Planes theirs = planes_of(other);
  for (std::int64_t i = 0; i < sums.count(); ++i) {
    const std::int32_t top = std::max(mine.bins[i], theirs.bins[i]);
    raise_bin(mine, i, top, "merge_binned_sums");
    raise_bin(theirs, i, top, "merge_binned_sums");
    mine.d0[i] += theirs.d0[i];
    mine.d1[i] += theirs.d1[i];
    mine.d2[i] += theirs.d2[i];
  }
}

BinnedPart part_of(const BinnedSums& sums, std::int64_t offset) {
  check_range(sums, offset, 0, "part_of");
  const std::int64_t count = sums.count();
  const double* digits = sums.digits.values<double>().data();
  return {sums.bins.values<std::int32_t>().data() + offset, digits + offset,
          digits + count + offset, digits + 2 * count + offset};
}

namespace {

/// Adds (`add`) or writes one part's digits (d0, d1, d2 at bins `from`), each element moved up to
/// bins[i] (at least its own), into o0, o1, o2. Every digit is loaded and the shift picks with
/// selects; the pointers are restrict parameters: both let the loop vectorise.
template <bool add>
[[gnu::always_inline]] inline void add_aligned(
    const std::int32_t* __restrict bins, const std::int32_t* __restrict from,
    const double* __restrict d0, const double* __restrict d1, const double* __restrict d2,
    double* __restrict o0, double* __restrict o1, double* __restrict o2, std::int64_t count) {
  for (std::int64_t i = 0; i < count; ++i) {
    const std::int32_t shift = bins[i] - from[i];
    const double low = d0[i];
    const double middle = d1[i];
    const double high = d2[i];
    const double new_low = shift == 0 ? low : shift == 1 ? middle : shift == 2 ? high : 0.0;
    const double new_middle = shift == 0 ? middle : shift == 1 ? high : 0.0;
    const double new_high = shift == 0 ? high : 0.0;
    o0[i] = add ? o0[i] + new_low : new_low;
    o1[i] = add ? o1[i] + new_middle : new_middle;
    o2[i] = add ? o2[i] + new_high : new_high;
  }
}

/// merge_binned_parts: the largest bin of each element, then each part's digits moved to it and
/// summed, part after part (parts outermost, so that every loop runs along the elements).
template <class T>
[[gnu::always_inline]] inline void merge_parts_body(Planes out, const BinnedPart* parts,
                                                    std::size_t part_count, std::int64_t count) {
  std::memcpy(out.bins, parts[0].bins, static_cast<std::size_t>(count) * sizeof(std::int32_t));
  for (std::size_t p = 1; p < part_count; ++p) {
    std::int32_t* __restrict bins = out.bins;
    const std::int32_t* __restrict from = parts[p].bins;
    for (std::int64_t i = 0; i < count; ++i)
      bins[i] = std::max(bins[i], from[i]);
  }
  // The first part overwrites what out held.
  add_aligned<false>(out.bins, parts[0].bins, parts[0].d0, parts[0].d1, parts[0].d2, out.d0, out.d1,
                     out.d2, count);
  for (std::size_t p = 1; p < part_count; ++p) {
    add_aligned<true>(out.bins, parts[p].bins, parts[p].d0, parts[p].d1, parts[p].d2, out.d0,
                      out.d1, out.d2, count);
  }
}
MESHTENSOR_SIMD_KERNEL(merge_parts, merge_parts_body)

}  // namespace

void merge_binned_parts(BinnedSums& sums, std::span<const BinnedPart> parts) {
  const ProfileScope profile(ProfileRow::exact_sums);
  if (parts.empty()) throw InvalidArgument("merge_binned_parts: no parts to merge");
  merge_parts<void>(planes_of(sums), parts.data(), parts.size(), sums.count());
}

namespace {

/// The one rounding of an exact sum: the digit sums of one element (integers below 2^53 in
/// magnitude) at bin `bin`, divided by `divisor`, rounded to nearest-even in the format of
/// `exponent_bits` / `mantissa_bits`. Returns the bit pattern.
std::uint64_t round_digits(const double* digit, std::int32_t bin, std::uint64_t divisor,
                           int exponent_bits, int mantissa_bits) {
  // The digit sums are integers below 2^53 in magnitude: the total fits 118 bits.
  const auto as_int = [&](int plane) {
    return static_cast<Int128>(static_cast<std::int64_t>(digit[plane]));
  };
  const Int128 total = (as_int(2) << 64) + (as_int(1) << 32) + as_int(0);
  const bool negative = total < 0;
  UInt128 magnitude = negative ? -static_cast<UInt128>(total) : static_cast<UInt128>(total);
  int exponent = kBinBits * bin - 3 * kBinBits;
  bool sticky = false;
  if (std::has_single_bit(divisor)) {
    // Dividing by a power of two only moves the exponent.
    exponent -= static_cast<int>(std::bit_width(divisor)) - 1;
  } else if (magnitude != 0) {
    // Put the leading bit at position 127 so the quotient keeps at least 64 bits.
    const auto high = static_cast<std::uint64_t>(magnitude >> 64);
    const int shift = high != 0 ? std::countl_zero(high)
                                : 64 + std::countl_zero(static_cast<std::uint64_t>(magnitude));
    magnitude <<= shift;
    exponent -= shift;
    // One 64-bit division gives a quotient of at least 64 - bit_width(divisor) bits; rounding
    // needs the kept bits, a guard bit and the sticky bit.
    if (64 - static_cast<int>(std::bit_width(divisor)) >= mantissa_bits + 2) {
      // (high * 2^64 + low) / d = q * 2^64 + (r * 2^64 + low) / d with the last term below
      // 2^64: q is the quotient truncated at 2^64, inexact when r or low is not zero.
      const auto top = static_cast<std::uint64_t>(magnitude >> 64);
      sticky = top % divisor != 0 || static_cast<std::uint64_t>(magnitude) != 0;
      magnitude = top / divisor;
      exponent += 64;
    } else {
      const UInt128 quotient = magnitude / divisor;
      sticky = quotient * divisor != magnitude;
      magnitude = quotient;
    }
  }
  const auto high = static_cast<std::uint64_t>(magnitude >> 64);
  if (high != 0) {
    const int shift = 64 - std::countl_zero(high);
    sticky = sticky || (magnitude & ((UInt128{1} << shift) - 1)) != 0;
    magnitude >>= shift;
    exponent += shift;
  }
  const auto significand = static_cast<std::uint64_t>(magnitude);
  return significand == 0 ? 0
                          : round_to_format(negative, significand, exponent, sticky, exponent_bits,
                                            mantissa_bits);
}

/// a + b = sum + the returned error, exactly (Knuth's two-sum).
inline double two_sum_error(double a, double b, double sum) {
  const double b_part = sum - a;
  return (a - (sum - b_part)) + (b - b_part);
}

/// The elements' f32 roundings (bits into `out`) of their digit sums times 2^(32 * bin - 96 -
/// shift) (a power-of-two divisor folded in), through doubles, branch-free so that it
/// vectorises: the digits sum to t + r exactly with |r| a few units in t's last place, so rounding
/// t to f32 is correct unless t lies within that distance of an f32 rounding boundary (a
/// midpoint), or the result is not a normal f32. needs_exact[i] is set then, for the exact path to
/// decide; the bits are the same either way. Non-finite elements get the canonical NaN.
template <class T>
[[gnu::always_inline]] inline void round_to_f32_fast_body(
    const std::int32_t* bins, const double* d0, const double* d1, const double* d2,
    std::int64_t shift, std::uint32_t* out, std::uint8_t* needs_exact, std::int64_t count) {
  for (std::int64_t i = 0; i < count; ++i) {
    const double high = d2[i] * 0x1p64;
    const double middle = d1[i] * 0x1p32;
    const double partial = high + middle;
    const double total = partial + d0[i];
    const double error =
        two_sum_error(high, middle, partial) + two_sum_error(partial, d0[i], total);
    // The exponent is within [-255, 224] and |total| below 2^119: the product is a normal double.
    const std::int64_t exponent = std::int64_t{kBinBits} * bins[i] - 3 * kBinBits - shift;
    const double scaled = total * std::bit_cast<double>((exponent + 1023) << 52);
    const double magnitude = std::fabs(scaled);
    // Conditions combined with & and | (no short circuits), so the loop has no branches.
    const bool normal = (magnitude >= 0x1p-126) & (magnitude < 0x1p127);
    // |error| <= |partial| / 2^53 + |total| / 2^53, and |partial| <= 2 |total| unless the total
    // cancelled, in which case this check is taken against a tiny total and fails safe.
    const bool small_error = std::fabs(error) <= std::fabs(total) * 0x1p-51;
    // The 29 bits f32 drops: a midpoint is 2^28; within 8 units of it the error could decide.
    const std::uint64_t dropped =
        std::bit_cast<std::uint64_t>(scaled) & ((std::uint64_t{1} << 29) - 1);
    constexpr std::uint64_t kMidpoint = std::uint64_t{1} << 28;
    const bool near_midpoint = (dropped + 8 >= kMidpoint) & (dropped <= kMidpoint + 8);
    const bool zero = total == 0.0;
    const bool non_finite = bins[i] == kNonFiniteBin;
    const bool ok =
        non_finite | (zero & (error == 0.0)) | (!zero & normal & small_error & !near_midpoint);
    const auto narrow = std::bit_cast<std::uint32_t>(static_cast<float>(normal ? scaled : 0.0));
    out[i] = non_finite ? 0x7fc00000u : narrow;  // the canonical NaN
    needs_exact[i] = static_cast<std::uint8_t>(!ok);
  }
}
MESHTENSOR_SIMD_KERNEL(round_to_f32_fast, round_to_f32_fast_body)

}  // namespace

void round_binned_sums(const BinnedSums& sums, std::int64_t divisor, Tensor out) {
  const ProfileScope profile(ProfileRow::exact_sums);
  if (divisor <= 0)
    throw InvalidArgument(fmt::format("round_binned_sums: divisor {} is not positive", divisor));
  if ((out.dtype() != DType::f32 && out.dtype() != DType::f64) || out.numel() != sums.count()) {
    throw InvalidArgument(
        fmt::format("round_binned_sums needs an f32 or f64 output of {} elements, "
                    "got {} {}",
                    sums.count(), dtype_name(out.dtype()), out.shape().to_string()));
  }
  const std::int64_t count = sums.count();
  const std::int32_t* bins = sums.bins.values<std::int32_t>().data();
  const double* planes = sums.digits.values<double>().data();
  const bool f32 = out.dtype() == DType::f32;
  const auto wide_divisor = static_cast<std::uint64_t>(divisor);
  std::byte* out_bytes = out.bytes().data();
  const auto round_exactly = [&](std::int64_t i) {
    const double digit[3] = {planes[i], planes[count + i], planes[2 * count + i]};
    const std::uint64_t bits =
        bins[i] == kNonFiniteBin
            ? (f32 ? 0x7fc00000u : 0x7ff8000000000000ull)  // canonical NaN
            : round_digits(digit, bins[i], wide_divisor, f32 ? 8 : 11, f32 ? 23 : 52);
    if (f32) {
      const auto narrow = static_cast<std::uint32_t>(bits);
      std::memcpy(out_bytes + i * 4, &narrow, sizeof narrow);
    } else {
      std::memcpy(out_bytes + i * 8, &bits, sizeof bits);
    }
  };
  if (!f32 || !std::has_single_bit(wide_divisor)) {
    for (std::int64_t i = 0; i < count; ++i)
      round_exactly(i);
    return;
  }
  const auto shift = static_cast<std::int64_t>(std::bit_width(wide_divisor)) - 1;
  constexpr std::int64_t kChunk = 1024;
  std::uint32_t rounded[kChunk];
  std::uint8_t needs_exact[kChunk] = {};  // whole words are read past a short last chunk
  for (std::int64_t begin = 0; begin < count; begin += kChunk) {
    const std::int64_t n = std::min(kChunk, count - begin);
    round_to_f32_fast<double>(bins + begin, planes + begin, planes + count + begin,
                              planes + 2 * count + begin, shift, rounded, needs_exact, n);
    std::memcpy(out_bytes + begin * 4, rounded, static_cast<std::size_t>(n) * 4);
    // Eight flags at a time: the exact path is rare.
    for (std::int64_t i0 = 0; i0 < n; i0 += 8) {
      std::uint64_t flags = 0;
      std::memcpy(&flags, needs_exact + i0, sizeof flags);  // kChunk holds whole words
      if (flags == 0) continue;
      for (std::int64_t i = i0; i < std::min(n, i0 + 8); ++i)
        if (needs_exact[i] != 0) round_exactly(begin + i);
    }
  }
}

}  // namespace meshtensor::kernels
