#pragma once

// The registry of the Hugging Face model classes meshtensor reads and writes, one file each
// under architectures/: how a class's config.json becomes a decoder and back, and its tensors.

#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <meshtensor/nn/models.hpp>

#include "config_reader.hpp"
#include "tensor_map.hpp"

namespace meshtensor::hf {

/// One Hugging Face model class.
class Architecture {
 public:
  Architecture(const char* head_class, const char* type, const char* base)
      : name(head_class), model_type(type), base_model(base) {}
  virtual ~Architecture() = default;
  const char* name;        ///< the head class: "Qwen2ForCausalLM"
  const char* model_type;  ///< config.json's "model_type": "qwen2"
  const char* base_model;  ///< the class without the head, read as this one: "Qwen2Model"
  /// The decoder a config.json of the class describes (absent keys: the class's defaults).
  virtual nn::DecoderSpec parse(ConfigReader& reader) const = 0;
  /// Whether a decoder exports as this class (the first class that takes it is chosen).
  virtual bool exports(const nn::DecoderSpec& config) const = 0;
  /// config.json's keys of the class for `config`, besides those every class writes.
  virtual void write(const nn::DecoderSpec& config, nlohmann::json& out) const = 0;
  /// Every tensor of a model of `config`, in model order.
  virtual void links(const nn::DecoderSpec& config, std::vector<Link>& out) const = 0;
};

/// Every class, in the order export tries them.
std::span<const Architecture* const> architectures();

/// The class named `name` (a head class or its base model), or null.
const Architecture* find_architecture(const std::string& name);

/// The class `config` exports as. InvalidArgument with the reason when none expresses it.
const Architecture& export_architecture(const nn::DecoderSpec& config);

}  // namespace meshtensor::hf
