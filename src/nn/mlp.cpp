#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/core/memory.hpp>
#include <meshtensor/core/random.hpp>
#include <meshtensor/core/shape.hpp>
#include <meshtensor/nn/layers.hpp>
#include <meshtensor/nn/mlp.hpp>

namespace meshtensor::nn {

Activation parse_activation(const std::string& text) {
  if (text == "relu") return Activation::relu;
  if (text == "gelu") return Activation::gelu;
  throw ParseError(fmt::format("unknown activation '{}' (expected relu or gelu)", text));
}

std::vector<std::int64_t> parse_mlp_hidden(const std::string& text) {
  constexpr std::string_view kPrefix = "mlp:";
  if (text.rfind(kPrefix, 0) != 0) {
    throw ParseError(
        fmt::format("unknown model '{}' (expected mlp:H1,H2,... e.g. mlp:1024,1024, or gpt or "
                    "gpt:layers=L,heads=H,dim=D,context=T)",
                    text));
  }
  const std::string sizes = text.substr(kPrefix.size());
  std::vector<std::int64_t> hidden;
  if (sizes.empty()) return hidden;
  for (std::string_view part : split(sizes, ',')) {
    const std::int64_t size =
        parse_count(part, std::int64_t{1} << 20, fmt::format("model '{}'", text));
    if (size == 0)
      throw ParseError(fmt::format("hidden size '{}' in model '{}' must be positive", part, text));
    hidden.push_back(size);
  }
  return hidden;
}

std::int64_t mlp_parameter_count(const MlpConfig& config) {
  std::int64_t count = 0;
  std::int64_t in = config.inputs;
  for (const std::int64_t width : config.hidden) {
    count += (in + 1) * width + (config.layernorm ? 2 * width : 0);
    in = width;
  }
  return count + (in + 1) * config.outputs;
}

std::unique_ptr<Sequential> make_mlp(const MlpConfig& config) {
  if (config.inputs < 1 || config.outputs < 1 ||
      std::any_of(config.hidden.begin(), config.hidden.end(), [](auto w) { return w < 1; })) {
    throw InvalidArgument(fmt::format("MLP sizes must be at least 1, got {} -> [{}] -> {}",
                                      config.inputs, fmt::join(config.hidden, ", "),
                                      config.outputs));
  }
  // Values and gradients of every parameter, counted before any layer allocates.
  const std::int64_t parameters = mlp_parameter_count(config);
  require_memory(8.0 * static_cast<double>(parameters),
                 fmt::format("an MLP {} -> [{}] -> {} ({} parameters)", config.inputs,
                             fmt::join(config.hidden, ", "), config.outputs, parameters));
  auto model = std::make_unique<Sequential>();
  std::int64_t in = config.inputs;
  std::uint64_t layer = 0;
  const auto linear = [&](std::int64_t out) {
    model->add(std::make_unique<Linear>(in, out, mix64(config.seed ^ mix64(++layer))));
    in = out;
  };
  for (const std::int64_t width : config.hidden) {
    linear(width);
    if (config.layernorm) model->add(std::make_unique<LayerNorm>(width));
    if (config.activation == Activation::gelu) {
      model->add(std::make_unique<GELU>());
    } else {
      model->add(std::make_unique<ReLU>());
    }
  }
  linear(config.outputs);
  return model;
}

}  // namespace meshtensor::nn
