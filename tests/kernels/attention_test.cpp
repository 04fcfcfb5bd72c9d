// Causal attention's backward split into a query side and a key side (context parallelism) gives
// the bits of the whole-sequence backward, however the keys are split.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include <meshtensor/core/random.hpp>
#include <meshtensor/kernels/attention.hpp>

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
