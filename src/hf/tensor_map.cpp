#include "tensor_map.hpp"

#include <algorithm>
#include <limits>
#include <utility>

#include <fmt/format.h>

#include <meshtensor/core/error.hpp>

#include "architecture.hpp"

namespace meshtensor::hf {

namespace {

/// The part and the index within it of column `c` of a parameter laid out as `columns`.
std::pair<int, std::int64_t> column_home(const nn::DecoderSpec& config, Columns columns,
                                         std::int64_t c) {
  switch (columns) {
    case Columns::identity:
      return {0, c};
    case Columns::gpt_qkv: {
      const std::int64_t hd = nn::decoder_head_dim(config);
      const std::int64_t head = c / (3 * hd);
      const std::int64_t part = (c % (3 * hd)) / hd;
      return {0, part * config.dim + head * hd + c % hd};
    }
    case Columns::llama_qkv: {
      const std::int64_t hd = nn::decoder_head_dim(config);
      const std::int64_t per = config.heads / config.kv_heads;
      const std::int64_t group = c / ((per + 2) * hd);
      const std::int64_t slot = (c % ((per + 2) * hd)) / hd;
      if (slot < per) return {0, (group * per + slot) * hd + c % hd};
      return {slot == per ? 1 : 2, group * hd + c % hd};
    }
    case Columns::gate_up: {
      const std::int64_t width =
          config.ffn / nn::decoder_mlp_blocks(config);  // a block's gate (up)
      const std::int64_t block = c / (2 * width);
      const std::int64_t part = (c % (2 * width)) / width;
      return {static_cast<int>(part), block * width + c % width};
    }
  }
  return {0, c};
}

/// Columns of a parameter with `count` columns that `link` takes.
std::int64_t part_columns(const nn::DecoderSpec& config, const Link& link, std::int64_t count) {
  std::int64_t n = 0;
  for (std::int64_t c = 0; c < count; ++c)
    n += column_home(config, link.columns, c).first == link.part ? 1 : 0;
  return n;
}

/// Calls copy(c, index) for each column c of a parameter with `count` columns that `link`
/// takes, with its index in the Hugging Face tensor.
template <typename Copy>
void for_each_column(const nn::DecoderSpec& config, const Link& link, std::int64_t count,
                     Copy copy) {
  for (std::int64_t c = 0; c < count; ++c) {
    const auto [part, index] = column_home(config, link.columns, c);
    if (part == link.part) copy(c, index);
  }
}

}  // namespace

std::vector<Link> links_of(const nn::DecoderSpec& config) {
  std::vector<Link> links;
  export_architecture(config).links(config, links);
  return links;
}

Shape parameter_shape(const nn::DecoderSpec& config, const std::string& ours) {
  const auto ends = [&](std::string_view tail) { return ours.ends_with(tail); };
  const std::int64_t d = config.dim;
  const std::int64_t v = config.vocabulary;
  const std::int64_t hd = nn::decoder_head_dim(config);
  const std::int64_t qkv = nn::decoder_qkv_width(config);
  const std::int64_t mlp_in = (config.mlp == nn::MlpKind::swiglu ? 2 : 1) * config.ffn;
  const auto [mlp_first, mlp_second] = nn::mlp_projection_names(config);
  if (ours == "embed.token.weight") return Shape{v, d};
  if (ours == "embed.position.weight") return Shape{config.context, d};
  if (ends("attn.qkv.weight")) return Shape{d, qkv};
  if (ends("attn.qkv.bias")) return Shape{qkv};
  if (ends("attn.proj.weight")) return Shape{config.heads * hd, d};
  if (ends("_norm.weight")) return Shape{hd};
  if (ends(mlp_first + ".weight")) return Shape{d, mlp_in};
  if (ends(mlp_first + ".bias")) return Shape{mlp_in};
  if (ends(mlp_second + ".weight")) return Shape{config.ffn, d};
  if (ours == "head.output.weight") return Shape{d, v};
  if (ours == "head.output.bias") return Shape{v};
  return Shape{d};  // the norms and the remaining biases
}

Shape hf_shape(const nn::DecoderSpec& config, const Link& link, const Shape& ours) {
  const std::int64_t columns = part_columns(config, link, ours.dims().back());
  if (ours.rank() == 1) return Shape{columns};
  if (ours.rank() != 2)
    throw InvalidArgument(fmt::format("{}: a parameter of shape {}", link.ours, ours.to_string()));
  return link.transposed ? Shape{columns, ours[0]} : Shape{ours[0], columns};
}

namespace {

/// Calls pair(i, j) for every element i of a parameter of shape `ours` that `link` takes, with
/// its place j in the Hugging Face tensor of shape `hf` (flat row-major indices both).
template <typename Pair>
void for_each_element(const nn::DecoderSpec& config, const Link& link, const Shape& ours,
                      const Shape& hf, Pair pair) {
  const std::int64_t count = ours.dims().back();
  const std::int64_t rows = ours.rank() == 2 ? ours[0] : 1;
  const std::int64_t width = hf.dims().back();
  for_each_column(config, link, count, [&](std::int64_t c, std::int64_t index) {
    for (std::int64_t r = 0; r < rows; ++r) {
      const std::int64_t at = link.transposed ? index * rows + r : r * width + index;
      pair(static_cast<std::size_t>(r * count + c), static_cast<std::size_t>(at));
    }
  });
}

}  // namespace

Tensor to_hf(const nn::DecoderSpec& config, const Link& link, const Tensor& ours) {
  const Tensor source = ours.contiguous();
  Tensor out(hf_shape(config, link, source.shape()), DType::f32);
  const auto from = source.values<float>();
  auto to = out.values<float>();
  for_each_element(config, link, source.shape(), out.shape(),
                   [&](std::size_t i, std::size_t j) { to[j] = from[i]; });
  return out;
}

namespace {

/// Where the columns of `block` that `link` holds lie: for each such block column, its index
/// in the block and its index in the Hugging Face tensor (a column, or a row when transposed).
struct BlockColumns {
  std::vector<std::int64_t> ours;
  std::vector<std::int64_t> theirs;
};

BlockColumns block_columns(const nn::DecoderSpec& config, const Link& link, const Block& block) {
  const int last = block.ours.rank() == 2 ? 1 : 0;
  const std::int64_t start =
      block.offset.empty() ? 0 : block.offset[static_cast<std::size_t>(last)];
  BlockColumns columns;
  for (std::int64_t j = 0; j < block.extent[last]; ++j) {
    const auto [part, index] = column_home(config, link.columns, start + j);
    if (part != link.part) continue;
    columns.ours.push_back(j);
    columns.theirs.push_back(index);
  }
  return columns;
}

}  // namespace

std::pair<std::int64_t, std::int64_t> rows_read(const nn::DecoderSpec& config, const Link& link,
                                                const Block& block) {
  const BlockColumns columns = block_columns(config, link, block);
  if (columns.ours.empty()) return {0, 0};
  if (block.ours.rank() == 2 && !link.transposed) {
    const std::int64_t first = block.offset.empty() ? 0 : block.offset[0];
    return {first, first + block.extent[0]};
  }
  // A 1-D tensor's elements and a transposed matrix's rows are the columns' indices.
  const auto [low, high] = std::minmax_element(columns.theirs.begin(), columns.theirs.end());
  return {*low, *high + 1};
}

void block_from_rows(const nn::DecoderSpec& config, const Link& link, const Block& block,
                     std::span<const float> rows, std::int64_t first, std::int64_t width,
                     Tensor& out) {
  const BlockColumns columns = block_columns(config, link, block);
  float* to = out.values<float>().data();
  const std::size_t count = columns.ours.size();
  if (block.ours.rank() != 2) {
    for (std::size_t c = 0; c < count; ++c)
      to[columns.ours[c]] = rows[static_cast<std::size_t>(columns.theirs[c] - first)];
    return;
  }
  const std::int64_t row_start = block.offset.empty() ? 0 : block.offset[0];
  const std::int64_t extent_rows = block.extent[0];
  const std::int64_t stride = block.extent[1];
  if (!link.transposed) {
    for (std::int64_t i = 0; i < extent_rows; ++i) {
      const float* source = rows.data() + (row_start + i - first) * width;
      float* target = to + i * stride;
      for (std::size_t c = 0; c < count; ++c)
        target[columns.ours[c]] = source[columns.theirs[c]];
    }
    return;
  }
  // Our column j is their row: tiles of columns, so the writes of a row stay together.
  constexpr std::size_t kTile = 16;
  for (std::size_t c0 = 0; c0 < count; c0 += kTile) {
    const std::size_t c1 = std::min(count, c0 + kTile);
    for (std::int64_t i = 0; i < extent_rows; ++i) {
      float* target = to + i * stride;
      for (std::size_t c = c0; c < c1; ++c)
        target[columns.ours[c]] =
            rows[static_cast<std::size_t>((columns.theirs[c] - first) * width + row_start + i)];
    }
  }
}

}  // namespace meshtensor::hf
