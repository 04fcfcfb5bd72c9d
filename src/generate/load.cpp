#include <map>
#include <sstream>

#include <fmt/format.h>

#include <meshtensor/checkpoint/checkpoint.hpp>
#include <meshtensor/comm/agree.hpp>
#include <meshtensor/core/error.hpp>
#include <meshtensor/generate/load.hpp>

namespace meshtensor::generate {

nn::GptConfig parse_architecture(const std::string& text) {
  const auto bad = [&](const std::string& why) {
    return DataError(fmt::format("architecture '{}' is not a byte-level GPT ({})", text, why));
  };
  std::istringstream words(text);
  std::string kind;
  words >> kind;
  if (kind != "gpt") throw bad("it is not a gpt");
  std::map<std::string, std::string> fields;
  for (std::string word; words >> word;) {
    const auto equals = word.find('=');
    if (equals == std::string::npos) throw bad(fmt::format("'{}' is not key=value", word));
    fields[word.substr(0, equals)] = word.substr(equals + 1);
  }
  if (fields["tokenizer"] != "bytes") throw bad("tokenizer '" + fields["tokenizer"] + "'");
  nn::GptConfig config;
  const auto number = [&](const char* key) {
    try {
      std::size_t used = 0;
      const long long value = std::stoll(fields.at(key), &used);
      if (used != fields.at(key).size() || value < 1) throw bad(key);
      return static_cast<std::int64_t>(value);
    } catch (const std::logic_error&) {
      throw bad(fmt::format("no positive {}", key));
    }
  };
  config.layers = number("layers");
  config.heads = number("heads");
  config.dim = number("dim");
  config.context = number("context");
  config.vocabulary = number("vocabulary");
  if (config.vocabulary > 256)
    throw bad(fmt::format("vocabulary {} is more than the 256 byte tokens", config.vocabulary));
  // The command line's ranges and checks, through its parser.
  try {
    const std::int64_t vocabulary = config.vocabulary;
    config = nn::parse_gpt_config(nn::gpt_config_text(config));
    config.vocabulary = vocabulary;
  } catch (const Error& e) {
    throw bad(e.what());
  }
  return config;
}

std::unique_ptr<nn::Gpt> load_gpt(comm::Communicator& world, const std::string& path) {
  // Rank 0 reads the index; every rank builds the model its architecture names.
  std::string architecture;
  std::string error;
  if (world.rank() == 0) {
    try {
      const checkpoint::Index index = checkpoint::read_index(path);
      const auto found = index.metadata.find("architecture");
      architecture = found == index.metadata.end() ? "" : found->second;
    } catch (const Error& e) {
      error = e.what();
    }
  }
  error = comm::broadcast_text(world, error, 0);
  if (!error.empty()) throw DataError(error);
  architecture = comm::broadcast_text(world, architecture, 0);
  if (architecture.empty())
    throw DataError(fmt::format("checkpoint {} names no model architecture", path));
  nn::GptConfig config;
  try {
    config = parse_architecture(architecture);
  } catch (const DataError& e) {
    throw DataError(fmt::format("checkpoint {}: {}", path, e.what()));
  }
  auto model = std::make_unique<nn::Gpt>(config);
  std::vector<checkpoint::LoadRequest> requests;
  for (nn::Parameter* p : model->parameters())
    requests.push_back({"model." + p->name,
                        p->value.shape(),
                        DType::f32,
                        {},
                        p->value.shape(),
                        world.rank() == 0});
  const std::vector<Tensor> loaded = checkpoint::load(world, path, requests);
  const std::vector<nn::Parameter*> parameters = model->parameters();
  for (std::size_t i = 0; i < parameters.size(); ++i)
    parameters[i]->value.copy_from(loaded[i]);
  return model;
}

}  // namespace meshtensor::generate
