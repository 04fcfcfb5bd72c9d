// config.json of the Hugging Face classes meshtensor reads and writes (the registry of
// architecture.hpp). Every key of their configs is computed, refused by name when it asks for
// another computation, or listed as inert (docs/huggingface.md, "Every key of config.json"). An
// absent key takes its class's own default.

#include "config_json.hpp"

#include <fmt/format.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/core/untrusted_json.hpp>
#include <meshtensor/hf/hf_model.hpp>

#include "architecture.hpp"
#include "config_reader.hpp"

namespace meshtensor::hf {

using Json = nlohmann::json;

namespace {

/// The class a config.json names in "architectures" (one string), checked against its
/// "model_type" when that is given.
const Architecture& config_class(const Json& config, const std::string& file) {
  std::string architecture;
  if (config.contains("architectures") && config["architectures"].is_array() &&
      config["architectures"].size() == 1 && config["architectures"][0].is_string()) {
    architecture = config["architectures"][0].get<std::string>();
  }
  // A base model's folder (GPT2Model, ...) holds the same tensors without the head: read as
  // the head class, whose head is the token table when tied (else its lm_head is missing).
  const Architecture* known = find_architecture(architecture);
  if (known == nullptr) {
    std::string names;
    for (const Architecture* a : architectures())
      names += (names.empty() ? "" : ", ") + std::string(a->name);
    const std::string named = !architecture.empty() ? "'" + architecture + "'"
                              : config.contains("architectures")
                                  ? json_excerpt(config["architectures"])
                                  : "(none given)";
    throw DataError(fmt::format("{}: architecture {} is not one of {}", file, named, names));
  }
  if (config.contains("model_type") && config["model_type"] != known->model_type) {
    throw DataError(
        fmt::format("{}: \"model_type\" is {} but the architecture {} is model_type "
                    "'{}': the folder describes two models",
                    file, json_excerpt(config["model_type"]), architecture, known->model_type));
  }
  return *known;
}

}  // namespace

std::string architecture_of(const nn::DecoderSpec& config) {
  return export_architecture(config).name;
}

std::pair<Json, Json> bos_eos(const tokenize::Tokenizer& tokenizer) {
  const auto id = [&](std::string_view content) -> Json {
    for (const tokenize::AddedToken& token : tokenizer.added_tokens())
      if (token.content == content) return token.id;
    return nullptr;
  };
  Json bos = id("<|begin_of_text|>");
  Json eos = id("<|end_of_text|>");
  if (bos.is_null()) bos = id("<|endoftext|>");
  if (eos.is_null()) eos = id("<|endoftext|>");
  return {bos, eos};
}

Json config_json(const nn::DecoderSpec& config, const tokenize::Tokenizer& tokenizer, DType dtype) {
  const Architecture& architecture = export_architecture(config);
  const auto [bos, eos] = bos_eos(tokenizer);
  Json out = {{"architectures", {architecture.name}},
              {"bos_token_id", bos},
              {"eos_token_id", eos},
              {"torch_dtype", dtype == DType::bf16  ? "bfloat16"
                              : dtype == DType::f16 ? "float16"
                                                    : "float32"},
              {"vocab_size", config.vocabulary},
              {"model_type", architecture.model_type}};
  architecture.write(config, out);
  return out;
}

nn::DecoderSpec parse_config_json(const Json& config, const std::string& file) {
  const Architecture& architecture = config_class(config, file);
  ConfigReader reader(config, file);
  return architecture.parse(reader);
}

}  // namespace meshtensor::hf
