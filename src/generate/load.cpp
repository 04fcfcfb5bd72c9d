#include <map>
#include <optional>
#include <sstream>

#include <fmt/format.h>

#include <meshtensor/checkpoint/checkpoint.hpp>
#include <meshtensor/comm/agree.hpp>
#include <meshtensor/comm/threads_backend.hpp>
#include <meshtensor/core/error.hpp>
#include <meshtensor/core/memory.hpp>
#include <meshtensor/generate/load.hpp>
#include <meshtensor/hf/hf_model.hpp>
#include <meshtensor/tp/style.hpp>

namespace meshtensor::generate {

namespace {

/// Most bytes of whole parameters one read brings in before they are copied into their targets.
constexpr double kLoadBatchBytes = 256.0 * (1 << 20);

/// The tokenizer `architecture` names, from `index`'s metadata; DataError naming the problem.
tokenize::Tokenizer named_tokenizer(const checkpoint::Index& index,
                                    const std::string& architecture) {
  const std::string name = nn::architecture_tokenizer(architecture);
  const std::int64_t vocabulary = (nn::parse_decoder_architecture(architecture)).vocabulary;
  if (name == "bytes") {
    if (vocabulary != 256) {
      throw DataError(
          fmt::format("its architecture names the byte tokenizer with a vocabulary of {}, not 256",
                      vocabulary));
    }
    return tokenize::Tokenizer::bytes();
  }
  if (name.rfind("bpe:", 0) != 0)
    throw DataError(fmt::format("its tokenizer '{}' is neither bytes nor bpe:<checksum>", name));
  const auto stored = index.metadata.find("tokenizer");
  if (stored == index.metadata.end())
    throw DataError(
        fmt::format("its architecture names the tokenizer {}, but it holds none", name));
  tokenize::Tokenizer tokenizer =
      tokenize::Tokenizer::from_json(stored->second, "its tokenizer metadata");
  if (tokenizer.name() != name) {
    throw DataError(
        fmt::format("its tokenizer is {} by its checksum, but its architecture names {}",
                    tokenizer.name(), name));
  }
  if (tokenizer.vocabulary() != vocabulary) {
    throw DataError(fmt::format("its tokenizer has {} tokens, its architecture a vocabulary of {}",
                                tokenizer.vocabulary(), vocabulary));
  }
  return tokenizer;
}

}  // namespace

std::string architecture_problem(const checkpoint::Index& index) {
  const auto found = index.metadata.find("architecture");
  if (found == index.metadata.end()) return "it names no model architecture";
  nn::DecoderSpec config;
  try {
    config = nn::parse_decoder_architecture(found->second);
    named_tokenizer(index, found->second);
  } catch (const Error& e) {
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
  const std::int64_t expected = nn::decoder_parameter_count(config);
  if (stored != expected) {
    return fmt::format(
        "its architecture '{}' has {} parameters, but its {} model tensor(s) hold {}: the "
        "metadata does not describe the tensors",
        found->second, expected, tensors, stored);
  }
  return {};
}

nn::DecoderSpec checked_architecture(const checkpoint::Index& index, const std::string& path) {
  if (const std::string problem = architecture_problem(index); !problem.empty())
    throw DataError(fmt::format("checkpoint {}: {}", path, problem));
  return nn::parse_decoder_architecture(index.metadata.at("architecture"));
}

nn::DecoderSpec model_architecture(const std::string& path) {
  if (const auto folder = hf::folder_of(path)) return hf::read_folder(*folder).config;
  return checked_architecture(checkpoint::read_index(path), path);
}

std::shared_ptr<const tokenize::Tokenizer> model_tokenizer(const std::string& path) {
  if (const auto folder = hf::folder_of(path)) return hf::read_folder(*folder).tokenizer;
  return std::make_shared<const tokenize::Tokenizer>(
      checkpoint_tokenizer(checkpoint::read_index(path), path));
}

std::vector<Tensor> load_blocks(comm::Communicator& world, const std::string& path,
                                std::span<const checkpoint::LoadRequest> requests) {
  if (const auto folder = hf::folder_of(path)) {
    // Each rank reads its own blocks: a damaged one (a NaN weight) fails on its reader alone,
    // and every rank must learn of it rather than wait in the next collective.
    std::vector<Tensor> blocks;
    std::exception_ptr failure;
    try {
      blocks = hf::load(hf::read_folder(*folder), requests);
    } catch (...) {
      failure = std::current_exception();
    }
    comm::throw_if_any_failed(world, failure);
    return blocks;
  }
  return checkpoint::load(world, path, requests);
}

void load_blocks_into(comm::Communicator& world, const std::string& path,
                      std::span<const checkpoint::LoadRequest> requests,
                      std::span<Tensor> targets) {
  if (requests.size() != targets.size())
    throw InvalidArgument(fmt::format("load_blocks_into: {} requests but {} targets",
                                      requests.size(), targets.size()));
  std::optional<hf::Folder> folder;
  if (const auto directory = hf::folder_of(path)) {
    std::exception_ptr failure;
    try {
      folder = hf::read_folder(*directory);
    } catch (...) {
      failure = std::current_exception();
    }
    comm::throw_if_any_failed(world, failure);
  }
  for (std::size_t first = 0; first < requests.size();) {
    double bytes = 0;
    std::size_t end = first;
    for (; end < requests.size() && (end == first || bytes < kLoadBatchBytes); ++end)
      bytes += 4.0 * static_cast<double>(requests[end].global_shape.numel());
    const auto batch = requests.subspan(first, end - first);
    if (folder) {
      // Straight into the targets; a rank's failure reaches every rank.
      std::exception_ptr failure;
      try {
        hf::load_into(*folder, batch, targets.subspan(first, end - first));
      } catch (...) {
        failure = std::current_exception();
      }
      comm::throw_if_any_failed(world, failure);
    } else {
      const std::vector<Tensor> loaded = checkpoint::load(world, path, batch);
      for (std::size_t i = first; i < end; ++i)
        targets[i].copy_from(loaded[i - first]);
    }
    first = end;
  }
}

tokenize::Tokenizer checkpoint_tokenizer(const checkpoint::Index& index, const std::string& path) {
  checked_architecture(index, path);
  return named_tokenizer(index, index.metadata.at("architecture"));
}

nn::DecoderSpec read_architecture(comm::Communicator& world, const std::string& path,
                                  std::int64_t models_in_process) {
  // Rank 0 reads the index and checks its architecture against its tensors and this process's
  // memory before anything is allocated; every rank then builds the model it names.
  std::string architecture;
  std::exception_ptr failure;
  if (world.rank() == 0) {
    try {
      const nn::DecoderSpec config = model_architecture(path);
      require_memory(nn::decoder_model_bytes(config) * static_cast<double>(models_in_process),
                     fmt::format("{} cop{} of the model of checkpoint {} ({} parameters)",
                                 models_in_process, models_in_process == 1 ? "y" : "ies", path,
                                 nn::decoder_parameter_count(config)));
      architecture = nn::decoder_architecture_text(config);
    } catch (...) {
      failure = std::current_exception();
    }
  }
  comm::throw_if_any_failed(world, failure);
  return nn::parse_decoder_architecture(comm::broadcast_text(world, architecture, 0));
}

namespace {

/// The request of this rank's block of `p` (its split's, or the whole parameter).
checkpoint::LoadRequest block_request(const nn::Parameter& p, const comm::Communicator& world) {
  const bool split = p.split.global_shape.rank() > 0;
  return {"model." + p.name, p.global_shape(),
          DType::f32,        split ? p.split.offset : std::vector<std::int64_t>{},
          p.value.shape(),   split ? p.split.saves : world.rank() == 0};
}

/// Reads every parameter's block of `model` from `path` into it.
void load_parameters(comm::Communicator& world, const std::string& path, nn::Decoder& model) {
  std::vector<checkpoint::LoadRequest> requests;
  std::vector<Tensor> targets;
  for (nn::Parameter* p : model.parameters()) {
    requests.push_back(block_request(*p, world));
    targets.push_back(p->value);
  }
  load_blocks_into(world, path, requests, targets);
}

}  // namespace

std::unique_ptr<nn::Decoder> load_decoder(comm::Communicator& world, const std::string& path,
                                          std::int64_t models_in_process,
                                          const std::function<void(nn::Decoder&)>& prepare) {
  const nn::DecoderSpec config = read_architecture(world, path, models_in_process);
  std::unique_ptr<nn::Decoder> model;
  {
    const nn::WeightsToBeLoaded loaded_next;
    model = nn::make_decoder(config);
  }
  if (prepare) prepare(*model);
  load_parameters(world, path, *model);
  return model;
}

CheckpointLocation locate_checkpoint(comm::Communicator& world, const std::string& path) {
  CheckpointLocation location;
  std::exception_ptr failure;
  if (hf::folder_of(path)) return {path, 0};  // a Hugging Face folder is one step
  if (world.rank() == 0) {
    try {
      location.directory = checkpoint::resolve(path);
      location.step = checkpoint::read_index(location.directory).step;
    } catch (...) {
      failure = std::current_exception();
    }
  }
  comm::throw_if_any_failed(world, failure);
  location.directory = comm::broadcast_text(world, location.directory, 0);
  location.step = std::stoll(comm::broadcast_text(world, std::to_string(location.step), 0));
  return location;
}

std::unique_ptr<tp::TensorParallel> generation_group(comm::Communicator& world,
                                                     comm::ReductionMode mode) {
  return std::make_unique<tp::TensorParallel>(
      std::shared_ptr<comm::Communicator>(&world, [](comm::Communicator*) {}), mode, false);
}

void parallelize_for_generation(nn::Decoder& model, tp::TensorParallel& group) {
  if (group.size() <= 1) return;
  const nn::DecoderSpec config = model.decoder_spec();
  tp::check_decoder_degree(config, group.size());
  tp::parallelize_module(model, group, tp::decoder_plan(config, false));
}

std::unique_ptr<nn::Decoder> load_for_generation(comm::Communicator& world, const std::string& path,
                                                 tp::TensorParallel& group,
                                                 comm::ReductionMode mode,
                                                 std::int64_t models_in_process) {
  // Split before reading: each rank reads and holds its own blocks only.
  return load_decoder(world, path, models_in_process, [&](nn::Decoder& model) {
    model.set_exact_sums(mode == comm::ReductionMode::exact);
    parallelize_for_generation(model, group);
  });
}

hf::ExportReport export_hf(const std::string& source, const std::string& out,
                           const hf::ExportOptions& options) {
  const nn::DecoderSpec config = model_architecture(source);
  hf::architecture_of(config);  // a model Hugging Face cannot express is refused before reading
  const std::shared_ptr<const tokenize::Tokenizer> tokenizer = model_tokenizer(source);
  hf::ExportReport report;
  comm::run_threads(1, [&](comm::Communicator& world) {
    const std::unique_ptr<nn::Decoder> model = load_decoder(world, source);
    std::map<std::string, Tensor> parameters;
    for (nn::Parameter* p : model->parameters())
      parameters.emplace(p->name, p->value);
    report = hf::export_folder(out, config, *tokenizer, parameters, options);
  });
  return report;
}

}  // namespace meshtensor::generate
