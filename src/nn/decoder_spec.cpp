#include <algorithm>
#include <numeric>

#include <fmt/format.h>

#include <meshtensor/nn/decoder_spec.hpp>

namespace meshtensor::nn {

std::int64_t decoder_head_dim(const DecoderSpec& spec) {
  return spec.head_dim > 0 ? spec.head_dim : spec.dim / std::max<std::int64_t>(spec.heads, 1);
}

std::int64_t decoder_mlp_blocks(const DecoderSpec& spec) {
  return std::gcd(spec.ffn, spec.heads);
}

std::int64_t decoder_qkv_width(const DecoderSpec& spec) {
  return (spec.heads + 2 * spec.kv_heads) * decoder_head_dim(spec);
}

namespace {

std::int64_t norm_parameters(const DecoderSpec& spec, std::int64_t features) {
  return spec.norm == NormKind::layer_norm ? 2 * features : features;
}

}  // namespace

std::int64_t decoder_block_parameters(const DecoderSpec& s) {
  const std::int64_t hd = decoder_head_dim(s);
  const std::int64_t qkv = decoder_qkv_width(s);
  const std::int64_t attention = s.dim * qkv + s.heads * hd * s.dim + (s.qk_norm ? 2 * hd : 0) +
                                 (s.qkv_bias ? qkv : 0) + (s.out_bias ? s.dim : 0);
  const std::int64_t gate = s.mlp == MlpKind::swiglu ? 2 : 1;  // gate and up, or fc
  const std::int64_t mlp = (gate + 1) * s.dim * s.ffn + (s.mlp_bias ? gate * s.ffn + s.dim : 0);
  return 2 * norm_parameters(s, s.dim) + attention + mlp;
}

std::int64_t decoder_parameter_count(const DecoderSpec& s) {
  const std::int64_t embedding =
      s.vocabulary * s.dim + (s.positions == PositionKind::learned ? s.context * s.dim : 0);
  const std::int64_t head = norm_parameters(s, s.dim) +
                            (s.tie ? 0 : s.dim * s.vocabulary + (s.head_bias ? s.vocabulary : 0));
  return embedding + s.layers * decoder_block_parameters(s) + head;
}

std::string decoder_spec_problem(const DecoderSpec& s) {
  if (s.layers < 1 || s.heads < 1 || s.kv_heads < 1 || s.dim < 1 || s.ffn < 1 || s.context < 1 ||
      s.vocabulary < 1 || s.head_dim < 0) {
    return fmt::format(
        "layers {}, heads {}, kv_heads {}, dim {}, ffn {}, context {} and vocabulary {} must be "
        "positive",
        s.layers, s.heads, s.kv_heads, s.dim, s.ffn, s.context, s.vocabulary);
  }
  if (s.heads % s.kv_heads != 0)
    return fmt::format("{} kv_heads do not divide the {} heads", s.kv_heads, s.heads);
  if (s.head_dim == 0 && s.dim % s.heads != 0) {
    return fmt::format(
        "dim {} does not split into {} heads (give head_dim=N for heads of another width)", s.dim,
        s.heads);
  }
  if (s.positions == PositionKind::rotary && decoder_head_dim(s) % 2 != 0) {
    return fmt::format("the head dim {} is odd; rotary embeddings turn pairs of values",
                       decoder_head_dim(s));
  }
  return {};
}

namespace {

/// Each integer key of a model text: its field and its largest value.
struct IntegerKey {
  std::string_view name;
  std::int64_t DecoderSpec::*field;
  std::int64_t limit;
};

constexpr IntegerKey kIntegerKeys[] = {
    {"layers", &DecoderSpec::layers, 256},     {"heads", &DecoderSpec::heads, 256},
    {"kv_heads", &DecoderSpec::kv_heads, 256}, {"dim", &DecoderSpec::dim, 8192},
    {"ffn", &DecoderSpec::ffn, 65536},         {"context", &DecoderSpec::context, 1 << 20},
    {"head_dim", &DecoderSpec::head_dim, 1024}};

}  // namespace

std::int64_t* decoder_integer_key(DecoderSpec& spec, std::string_view key) {
  for (const IntegerKey& k : kIntegerKeys)
    if (k.name == key) return &(spec.*k.field);
  return nullptr;
}

std::int64_t decoder_key_limit(std::string_view key) {
  for (const IntegerKey& k : kIntegerKeys)
    if (k.name == key) return k.limit;
  return 0;
}

std::string decoder_family_name(const DecoderSpec& spec) {
  return spec.family == DecoderFamily::gpt ? "gpt" : "llama";
}

std::pair<std::string, std::string> mlp_projection_names(const DecoderSpec& spec) {
  if (spec.mlp == MlpKind::gelu) return {"mlp.fc", "mlp.proj"};
  return {"mlp.gate_up", "mlp.down"};
}

}  // namespace meshtensor::nn
