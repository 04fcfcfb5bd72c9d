#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <meshtensor/nn/module.hpp>

namespace meshtensor::nn {

/// Activation between the hidden layers of an MLP.
enum class Activation : std::uint8_t { relu, gelu };

/// "relu" or "gelu"; ParseError naming the text otherwise.
Activation parse_activation(const std::string& text);

/// An MLP: inputs -> hidden[0] -> ... -> outputs, each hidden layer Linear (+ LayerNorm) +
/// activation.
struct MlpConfig {
  std::int64_t inputs = 784;
  std::vector<std::int64_t> hidden{1024, 1024};
  std::int64_t outputs = 10;
  Activation activation = Activation::relu;
  bool layernorm = false;
  std::uint64_t seed = 0;
};

/// Parses "mlp:1024,1024" (hidden sizes; "mlp:" alone is a linear model) into config.hidden;
/// ParseError naming the bad part otherwise (unknown kind, a size that is not a positive number).
std::vector<std::int64_t> parse_mlp_hidden(const std::string& text);

/// Number of parameters of the MLP a config builds.
std::int64_t mlp_parameter_count(const MlpConfig& config);

/// Builds the model; the same config gives the same initial bits everywhere. InvalidArgument for
/// a size below 1; ResourceError, before anything is allocated, for a model that does not fit
/// in memory.
std::unique_ptr<Sequential> make_mlp(const MlpConfig& config);

}  // namespace meshtensor::nn
