#pragma once

#include <cstdint>

#include <meshtensor/nn/gpt.hpp>

namespace meshtensor::testing {

/// The dims of a GPT small enough for unit tests; every field not given keeps this default (the
/// seed and init those of nn::GptConfig).
struct TinyGpt {
  std::int64_t layers = 2;
  std::int64_t heads = 2;
  std::int64_t dim = 16;
  std::int64_t context = 8;
  std::int64_t vocabulary = 256;
  std::uint64_t seed = nn::GptConfig{}.seed;
  double init_std = nn::GptConfig{}.init_std;
};

/// The one GPT config builder of the C++ tests: tiny_gpt({.heads = 4, .context = 10}).
inline nn::GptConfig tiny_gpt(const TinyGpt& dims = {}) {
  nn::GptConfig config;
  config.layers = dims.layers;
  config.heads = dims.heads;
  config.dim = dims.dim;
  config.context = dims.context;
  config.vocabulary = dims.vocabulary;
  config.seed = dims.seed;
  config.init_std = dims.init_std;
  return config;
}

}  // namespace meshtensor::testing
