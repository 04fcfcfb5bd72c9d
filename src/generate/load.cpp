#include <map>
#include <sstream>

#include <fmt/format.h>

#include <meshtensor/checkpoint/checkpoint.hpp>
#include <meshtensor/comm/agree.hpp>
#include <meshtensor/core/error.hpp>
#include <meshtensor/core/memory.hpp>
#include <meshtensor/generate/load.hpp>

namespace meshtensor::generate {

std::string architecture_text(const nn::GptConfig& config) {
  return fmt::format("gpt layers={} heads={} dim={} context={} vocabulary={} tokenizer=bytes",
                     config.layers, config.heads, config.dim, config.context, config.vocabulary);
}

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

std::string architecture_problem(const checkpoint::Index& index) {
  const auto found = index.metadata.find("architecture");
  if (found == index.metadata.end()) return "it names no model architecture";
  nn::GptConfig config;
  try {
    config = parse_architecture(found->second);
  } catch (const DataError& e) {
    return e.what();
  }
  std::int64_t stored = 0;
  std::int64_t tensors = 0;
  for (const checkpoint::StoredTensor& tensor : index.tensors) {
    if (tensor.name.rfind("model.", 0) != 0) continue;
    if (tensor.dtype != DType::f32) {
      return fmt::format("model tensor '{}' is {}, not f32", tensor.name, dtype_name(tensor.dtype));
    }
    stored += tensor.shape.numel();
    ++tensors;
  }
  const std::int64_t expected = nn::gpt_parameter_count(config);
  if (stored != expected) {
    return fmt::format(
        "its architecture '{}' has {} parameters, but its {} model tensor(s) hold {}: the "
        "metadata does not describe the tensors",
        found->second, expected, tensors, stored);
  }
  return {};
}

nn::GptConfig checked_architecture(const checkpoint::Index& index, const std::string& path) {
  if (const std::string problem = architecture_problem(index); !problem.empty())
    throw DataError(fmt::format("checkpoint {}: {}", path, problem));
  return parse_architecture(index.metadata.at("architecture"));
}

nn::GptConfig read_architecture(comm::Communicator& world, const std::string& path,
                                std::int64_t models_in_process) {
  // Rank 0 reads the index and checks its architecture against its tensors and this process's
  // memory before anything is allocated; every rank then builds the model it names.
  std::string architecture;
  std::exception_ptr failure;
  if (world.rank() == 0) {
    try {
      const checkpoint::Index index = checkpoint::read_index(path);
      const nn::GptConfig config = checked_architecture(index, path);
      require_memory(
          nn::gpt_model_bytes(config) * static_cast<double>(models_in_process),
          fmt::format("{} cop{} of the model of checkpoint {} ({} parameters)", models_in_process,
                      models_in_process == 1 ? "y" : "ies", path, nn::gpt_parameter_count(config)));
      architecture = index.metadata.at("architecture");
    } catch (...) {
      failure = std::current_exception();
    }
  }
  comm::throw_if_any_failed(world, failure);
  return parse_architecture(comm::broadcast_text(world, architecture, 0));
}

std::unique_ptr<nn::Gpt> load_gpt(comm::Communicator& world, const std::string& path,
                                  std::int64_t models_in_process) {
  auto model = std::make_unique<nn::Gpt>(read_architecture(world, path, models_in_process));
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
