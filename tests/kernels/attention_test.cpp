// Causal attention's tiled kernels give the bits of the plain row-by-row loops their contract
// describes at every SIMD level and head size, and the backward split into a query side and a key
// side (context parallelism) gives the bits of the whole-sequence backward, however the keys are
// split.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <meshtensor/core/random.hpp>
#include <meshtensor/kernels/activation.hpp>
#include <meshtensor/kernels/attention.hpp>
#include <meshtensor/kernels/simd.hpp>

namespace meshtensor::kernels {
namespace {

struct Head {
  std::int64_t length;
  std::int64_t hd;
  std::vector<float> q, k, k_t, v, v_t, d_out;
  std::vector<RowStats> stats;
  float scale;

  Head(std::int64_t length_, std::int64_t hd_, std::uint64_t seed) : length(length_), hd(hd_) {
    const auto n = static_cast<std::size_t>(length * hd);
    q.resize(n), k.resize(n), k_t.resize(n), v.resize(n), v_t.resize(n), d_out.resize(n);
    for (std::size_t e = 0; e < n; ++e) {
      q[e] = static_cast<float>(normal_sample(seed, e));
      k[e] = static_cast<float>(normal_sample(seed + 1, e));
      v[e] = static_cast<float>(normal_sample(seed + 2, e));
      d_out[e] = static_cast<float>(normal_sample(seed + 3, e));
    }
    for (std::int64_t i = 0; i < length; ++i) {
      for (std::int64_t d = 0; d < hd; ++d) {
        k_t[static_cast<std::size_t>(d * length + i)] = k[static_cast<std::size_t>(i * hd + d)];
        v_t[static_cast<std::size_t>(d * length + i)] = v[static_cast<std::size_t>(i * hd + d)];
      }
    }
    scale = 1.0f / std::sqrt(static_cast<float>(hd));
    stats.resize(static_cast<std::size_t>(length));
    std::vector<float> p(static_cast<std::size_t>(length));
    std::vector<float> o(static_cast<std::size_t>(hd));
    const HeadCache cache{k_t.data(), v.data(), length, hd};
    for (std::int64_t i = 0; i < length; ++i)
      attention_row(q.data() + i * hd, cache, i + 1, scale, p.data(), o.data(), &stats[i]);
  }
  HeadGradientInputs inputs() const {
    HeadGradientInputs in;
    in.queries = q.data();
    in.keys = k.data();
    in.keys_t = k_t.data();
    in.values_t = v_t.data();
    in.stats = stats.data();
    in.grad_output = d_out.data();
    in.length = length;
    in.head_dim = hd;
    in.scale = scale;
    return in;
  }
};

bool same_bits(const float* a, const float* b, std::int64_t n) {
  return std::memcmp(a, b, sizeof(float) * static_cast<std::size_t>(n)) == 0;
}

// ---- The contract as plain scalar loops, one row at a time --------------------------------------

/// s_j = Σ_d a[d]·bt[d·stride + j] for j < count, each from +0 in ascending d.
std::vector<float> reference_dots(const float* a, const float* bt, std::int64_t stride,
                                  std::int64_t depth, std::int64_t count) {
  std::vector<float> out(static_cast<std::size_t>(count), 0.0f);
  for (std::int64_t j = 0; j < count; ++j)
    for (std::int64_t d = 0; d < depth; ++d)
      out[j] = out[j] + a[d] * bt[d * stride + j];
  return out;
}

/// o_d = Σ_j w[j]·rows[j·depth + d], each from +0 in ascending j.
void reference_weighted(const float* w, const float* rows, std::int64_t count, std::int64_t depth,
                        float* out) {
  for (std::int64_t d = 0; d < depth; ++d) {
    float sum = 0.0f;
    for (std::int64_t j = 0; j < count; ++j)
      sum = sum + w[j] * rows[j * depth + d];
    out[d] = sum;
  }
}

RowStats reference_row(const float* q, const float* k_t, const float* v, std::int64_t stride,
                       std::int64_t hd, std::int64_t count, float scale, float* out) {
  std::vector<float> p = reference_dots(q, k_t, stride, hd, count);
  float largest = p[0] * scale;
  bool nan = false;
  for (float& s : p) {
    s = s * scale;
    largest = std::max(largest, s);
    nan = nan || s != s;
  }
  float total = 0.0f;
  for (float& s : p) {
    s = exp_f32(s - largest);
    total = total + s;
  }
  const float nan_value = std::numeric_limits<float>::quiet_NaN();
  for (float& s : p)
    s = nan ? nan_value : s / total;
  reference_weighted(p.data(), v, count, hd, out);
  return {largest, nan ? nan_value : total};
}

/// The whole backward row by row: dQ_i, then dK_j and dV_j of every key the row sees.
void reference_backward(const HeadGradientInputs& in, float* dq, float* dk, float* dv) {
  const std::int64_t hd = in.head_dim;
  std::fill_n(dk, in.length * hd, 0.0f);
  std::fill_n(dv, in.length * hd, 0.0f);
  for (std::int64_t i = 0; i < in.length; ++i) {
    const float* q = in.queries + i * hd;
    const float* d_out = in.grad_output + i * hd;
    const std::int64_t count = i + 1;
    std::vector<float> p = reference_dots(q, in.keys_t, in.length, hd, count);
    for (float& s : p)
      s = exp_f32(s * in.scale - in.stats[i].largest) / in.stats[i].total;
    std::vector<float> ds = reference_dots(d_out, in.values_t, in.length, hd, count);
    float weighted = 0.0f;
    for (std::int64_t j = 0; j < count; ++j)
      weighted = weighted + p[j] * ds[j];
    for (std::int64_t j = 0; j < count; ++j)
      ds[j] = p[j] * (ds[j] - weighted) * in.scale;
    reference_weighted(ds.data(), in.keys, count, hd, dq + i * hd);
    for (std::int64_t j = 0; j < count; ++j) {
      for (std::int64_t d = 0; d < hd; ++d) {
        dk[j * hd + d] = dk[j * hd + d] + ds[j] * q[d];
        dv[j * hd + d] = dv[j * hd + d] + p[j] * d_out[d];
      }
    }
  }
}

std::vector<SimdLevel> levels() {
  std::vector<SimdLevel> out{SimdLevel::baseline};
  if (best_simd_level() >= SimdLevel::avx2) out.push_back(SimdLevel::avx2);
  if (best_simd_level() >= SimdLevel::avx512) out.push_back(SimdLevel::avx512);
  return out;
}

struct LevelGuard {
  SimdLevel saved = simd_level();
  ~LevelGuard() { set_simd_level(saved); }
};

TEST(AttentionKernels, TilesGiveThePlainLoopsBitsAtEveryLevelAndHeadSize) {
  const LevelGuard guard;
  for (const auto& [length, hd] : {std::pair<std::int64_t, std::int64_t>{1, 4},
                                   {7, 1},
                                   {37, 8},
                                   {40, 6},
                                   {33, 12},
                                   {70, 32},
                                   {19, 64},
                                   {9, 100}}) {
    Head head(length, hd, 5 + static_cast<std::uint64_t>(length));
    const auto n = static_cast<std::size_t>(length * hd);
    std::vector<float> ref_o(n), ref_dq(n), ref_dk(n), ref_dv(n);
    std::vector<RowStats> ref_stats(static_cast<std::size_t>(length));
    for (std::int64_t i = 0; i < length; ++i)
      ref_stats[i] = reference_row(head.q.data() + i * hd, head.k_t.data(), head.v.data(), length,
                                   hd, i + 1, head.scale, ref_o.data() + i * hd);
    reference_backward(head.inputs(), ref_dq.data(), ref_dk.data(), ref_dv.data());
    std::vector<std::int64_t> positions(static_cast<std::size_t>(length));
    for (std::int64_t i = 0; i < length; ++i)
      positions[i] = i;
    const HeadCache cache{head.k_t.data(), head.v.data(), length, hd};
    for (const SimdLevel level : levels()) {
      set_simd_level(level);
      const std::string where =
          fmt::format("length {} head_dim {} at {}", length, hd, simd_level_name(level));
      std::vector<float> o(n), dq(n), dk(n), dv(n);
      std::vector<RowStats> stats(static_cast<std::size_t>(length));
      attention_rows(head.q.data(), hd, positions.data(), length, cache, head.scale, o.data(), hd,
                     stats.data());
      EXPECT_TRUE(same_bits(o.data(), ref_o.data(), length * hd)) << "forward, " << where;
      EXPECT_TRUE(same_bits(&stats[0].largest, &ref_stats[0].largest, 2 * length)) << where;
      std::vector<float> p(static_cast<std::size_t>(length)), row(static_cast<std::size_t>(hd));
      attention_row(head.q.data() + (length - 1) * hd, cache, length, head.scale, p.data(),
                    row.data());
      EXPECT_TRUE(same_bits(row.data(), ref_o.data() + (length - 1) * hd, hd)) << where;
      attention_backward(head.inputs(), dq.data(), dk.data(), dv.data());
      EXPECT_TRUE(same_bits(dq.data(), ref_dq.data(), length * hd)) << "dQ, " << where;
      EXPECT_TRUE(same_bits(dk.data(), ref_dk.data(), length * hd)) << "dK, " << where;
      EXPECT_TRUE(same_bits(dv.data(), ref_dv.data(), length * hd)) << "dV, " << where;
    }
  }
}

TEST(AttentionKernels, ANanScoreMakesTheRowNanAndLeavesTheOthers) {
  Head head(5, 4, 3);
  head.q[2 * 4] = std::numeric_limits<float>::quiet_NaN();  // row 2
  const HeadCache cache{head.k_t.data(), head.v.data(), 5, 4};
  const std::int64_t positions[] = {0, 1, 2, 3, 4};
  std::vector<float> o(20);
  std::vector<RowStats> stats(5);
  attention_rows(head.q.data(), 4, positions, 5, cache, head.scale, o.data(), 4, stats.data());
  for (std::int64_t i = 0; i < 5; ++i) {
    for (std::int64_t d = 0; d < 4; ++d)
      EXPECT_EQ(std::isnan(o[i * 4 + d]), i == 2) << "row " << i;
  }
  EXPECT_TRUE(std::isnan(stats[2].total));
}

TEST(SplitAttentionBackward, QueryAndKeySidesGiveTheWholeBackwardsBits) {
  const Head head(37, 8, 11);
  const auto n = static_cast<std::size_t>(head.length * head.hd);
  std::vector<float> dq(n), dk(n), dv(n);
  attention_backward(head.inputs(), dq.data(), dk.data(), dv.data());

  // The query side for an arbitrary set of rows (a head-tail rank: rows 3..8 and 29..36).
  std::vector<std::int64_t> positions;
  for (std::int64_t i = 3; i < 9; ++i)
    positions.push_back(i);
  for (std::int64_t i = 29; i < 37; ++i)
    positions.push_back(i);
  const auto rows = static_cast<std::int64_t>(positions.size());
  std::vector<float> q_rows, d_rows, split_dq(static_cast<std::size_t>(rows * head.hd));
  std::vector<RowStats> stat_rows;
  for (const std::int64_t i : positions) {
    q_rows.insert(q_rows.end(), head.q.begin() + i * head.hd, head.q.begin() + (i + 1) * head.hd);
    d_rows.insert(d_rows.end(), head.d_out.begin() + i * head.hd,
                  head.d_out.begin() + (i + 1) * head.hd);
    stat_rows.push_back(head.stats[static_cast<std::size_t>(i)]);
  }
  HeadGradientInputs local = head.inputs();
  local.queries = q_rows.data();
  local.grad_output = d_rows.data();
  local.stats = stat_rows.data();
  std::vector<float> weighted_rows(static_cast<std::size_t>(rows));
  attention_query_backward(local, positions.data(), rows, split_dq.data(), weighted_rows.data());
  for (std::int64_t r = 0; r < rows; ++r)
    EXPECT_TRUE(
        same_bits(split_dq.data() + r * head.hd, dq.data() + positions[r] * head.hd, head.hd))
        << "row " << positions[r];

  // Every row's sums, then the key side over pieces of any size.
  std::vector<std::int64_t> all(static_cast<std::size_t>(head.length));
  for (std::int64_t i = 0; i < head.length; ++i)
    all[static_cast<std::size_t>(i)] = i;
  std::vector<float> every_dq(n), weighted(static_cast<std::size_t>(head.length));
  attention_query_backward(head.inputs(), all.data(), head.length, every_dq.data(),
                           weighted.data());
  EXPECT_TRUE(same_bits(every_dq.data(), dq.data(), head.length * head.hd));
  HeadGradientInputs whole = head.inputs();
  whole.weighted = weighted.data();
  for (const std::int64_t piece : {1, 5, 13, 37}) {
    for (std::int64_t first = 0; first < head.length; first += piece) {
      const std::int64_t count = std::min(piece, head.length - first);
      std::vector<float> piece_dk(static_cast<std::size_t>(count * head.hd));
      std::vector<float> piece_dv(piece_dk.size());
      attention_key_backward(whole, first, count, piece_dk.data(), piece_dv.data());
      EXPECT_TRUE(same_bits(piece_dk.data(), dk.data() + first * head.hd, count * head.hd))
          << "keys " << first << " + " << count;
      EXPECT_TRUE(same_bits(piece_dv.data(), dv.data() + first * head.hd, count * head.hd))
          << "values " << first << " + " << count;
    }
  }
}

}  // namespace
}  // namespace meshtensor::kernels
