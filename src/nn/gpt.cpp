#include <cmath>
#include <map>
#include <sstream>

#include <fmt/format.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/core/memory.hpp>
#include <meshtensor/core/random.hpp>
#include <meshtensor/core/shape.hpp>
#include <meshtensor/nn/gpt.hpp>
#include <meshtensor/nn/models.hpp>

namespace meshtensor::nn {

namespace {

constexpr std::string_view kGptUsage = "gpt or gpt:layers=L,heads=H,dim=D,context=T,tie=0|1";

double residual_std(const GptConfig& config) {
  return config.init_std / std::sqrt(2.0 * static_cast<double>(config.layers));
}

}  // namespace

bool is_gpt_model(const std::string& text) {
  return text == "gpt" || text.rfind("gpt:", 0) == 0;
}

GptConfig parse_gpt_config(const std::string& text) {
  GptConfig config;
  if (text == "gpt") return config;
  constexpr std::string_view kPrefix = "gpt:";
  if (text.rfind(kPrefix, 0) != 0)
    throw ParseError(fmt::format("unknown model '{}' (expected {})", text, kGptUsage));
  std::int64_t tie = 0;
  const std::map<std::string_view, std::pair<std::int64_t*, std::int64_t>> keys{
      {"layers", {&config.layers, 256}},
      {"heads", {&config.heads, 256}},
      {"dim", {&config.dim, 8192}},
      {"context", {&config.context, 8192}},
      {"tie", {&tie, 1}}};
  std::map<std::string_view, bool> seen;
  for (std::string_view part : split(std::string_view(text).substr(kPrefix.size()), ',')) {
    const auto equals = part.find('=');
    const std::string_view key = part.substr(0, equals);
    const auto entry = keys.find(key);
    if (equals == std::string_view::npos || entry == keys.end()) {
      throw ParseError(
          fmt::format("'{}' in model '{}' is not one of layers=, heads=, dim=, "
                      "context=, tie= (expected {})",
                      part, text, kGptUsage));
    }
    if (seen[key]) throw ParseError(fmt::format("model '{}' gives {} twice", text, key));
    seen[key] = true;
    const auto [target, largest] = entry->second;
    const std::int64_t value =
        parse_count(part.substr(equals + 1), largest, fmt::format("model '{}'", text));
    if (value == 0 && target != &tie)
      throw ParseError(fmt::format("{} in model '{}' must be positive", part, text));
    *target = value;
  }
  config.tie = tie == 1;
  if (config.dim % config.heads != 0) {
    throw ParseError(fmt::format("model '{}': dim {} does not split into {} heads", text,
                                 config.dim, config.heads));
  }
  return config;
}

std::string gpt_config_text(const GptConfig& config) {
  return fmt::format("gpt:layers={},heads={},dim={},context={}{}", config.layers, config.heads,
                     config.dim, config.context, config.tie ? ",tie=1" : "");
}

std::string architecture_text(const GptConfig& config, const std::string& tokenizer) {
  return fmt::format("gpt layers={} heads={} dim={} context={}{} vocabulary={} tokenizer={}",
                     config.layers, config.heads, config.dim, config.context,
                     config.tie ? " tie=1" : "", config.vocabulary, tokenizer);
}

GptConfig parse_architecture(const std::string& text) {
  const auto bad = [&](const std::string& why) {
    return DataError(fmt::format("architecture '{}' is not a GPT's ({})", text, why));
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
  if (fields["tokenizer"].empty()) throw bad("it names no tokenizer");
  GptConfig config;
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
  if (fields.count("tie") != 0) {
    if (fields["tie"] != "0" && fields["tie"] != "1") throw bad("tie '" + fields["tie"] + "'");
    config.tie = fields["tie"] == "1";
  }
  if (config.vocabulary > kMaxVocabulary)
    throw bad(fmt::format("vocabulary {} is more than {}", config.vocabulary, kMaxVocabulary));
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

std::int64_t gpt_parameter_count(const GptConfig& c) {
  const std::int64_t d = c.dim;
  const std::int64_t block =
      2 * 2 * d + (d * 3 * d + 3 * d) + (d * d + d) + (d * 4 * d + 4 * d) + (4 * d * d + d);
  return c.vocabulary * d + c.context * d + c.layers * block + 2 * d +
         (c.tie ? 0 : d * c.vocabulary + c.vocabulary);
}

TransformerBlock::TransformerBlock(const GptConfig& config, std::uint64_t seed)
    : norm1_(config.dim),
      attention_(config.dim, config.heads, mix64(seed ^ 1), config.init_std, residual_std(config)),
      norm2_(config.dim),
      fc_(config.dim, 4 * config.dim, mix64(seed ^ 2), config.init_std),
      projection_(4 * config.dim, config.dim, mix64(seed ^ 3), residual_std(config)) {
  prefix_parameter_names(norm1_, "norm1");
  prefix_parameter_names(attention_, "attn");
  prefix_parameter_names(norm2_, "norm2");
  prefix_parameter_names(fc_, "mlp.fc");
  prefix_parameter_names(projection_, "mlp.proj");
}

Tensor TransformerBlock::forward(const Tensor& input) {
  Tensor x = run_forward(attention_, run_forward(norm1_, input));
  add_into(x, input);
  Tensor y = run_forward(projection_, run_forward(gelu_, run_forward(fc_, run_forward(norm2_, x))));
  add_into(y, x);
  return y;
}

void TransformerBlock::forward_for_backward(const Tensor& input) {
  Tensor x = run_forward(attention_, run_forward(norm1_, input));
  add_into(x, input);
  run_forward_for_backward(projection_,
                           run_forward(gelu_, run_forward(fc_, run_forward(norm2_, x))));
}

Tensor TransformerBlock::backward(const Tensor& grad_output, GradientSink& sink,
                                  bool need_input_grad) {
  const Tensor dy = grad_output.contiguous();
  const Tensor d_hidden =
      run_backward(gelu_, run_backward(projection_, dy, sink, true), sink, true);
  Tensor dx = run_backward(norm2_, run_backward(fc_, d_hidden, sink, true), sink, true);
  add_into(dx, dy);
  Tensor d_input =
      run_backward(norm1_, run_backward(attention_, dx, sink, true), sink, need_input_grad);
  if (!need_input_grad) return {};
  add_into(d_input, dx);
  return d_input;
}

std::vector<Parameter*> TransformerBlock::parameters() {
  return parameters_of({&norm1_, &attention_, &norm2_, &fc_, &projection_});
}

std::vector<std::pair<std::string, Module*>> TransformerBlock::children() {
  return {{"norm1", &norm1_}, {"attn", &attention_}, {"norm2", &norm2_},
          {"mlp.fc", &fc_},   {"mlp.act", &gelu_},   {"mlp.proj", &projection_}};
}

void TransformerBlock::set_exact_blocks(bool on) {
  attention_.set_exact_blocks(on);
  fc_.set_exact_blocks(0, on ? attention_.heads() : 0);
  projection_.set_exact_blocks(on ? attention_.heads() : 0, 0);
}

std::string TransformerBlock::describe() const {
  return fmt::format("TransformerBlock({})", attention_.describe());
}

LanguageModelHead::LanguageModelHead(const GptConfig& config, std::uint64_t seed,
                                     Parameter* tied_table)
    : norm_(config.dim),
      output_(config.dim, config.vocabulary, seed, config.init_std, tied_table == nullptr) {
  if (tied_table != nullptr) output_.tie_weight_to(*tied_table);
  prefix_parameter_names(norm_, "norm");
  prefix_parameter_names(output_, "output");
}

Tensor LanguageModelHead::forward(const Tensor& input) {
  return run_forward(output_, run_forward(norm_, input));
}

Tensor LanguageModelHead::backward(const Tensor& grad_output, GradientSink& sink,
                                   bool need_input_grad) {
  return run_backward(norm_, run_backward(output_, grad_output, sink, true), sink, need_input_grad);
}

std::vector<std::pair<std::string, Module*>> LanguageModelHead::children() {
  return {{"norm", &norm_}, {"output", &output_}};
}

void LanguageModelHead::set_exact_blocks(bool on) {
  output_.set_exact_blocks(0, on ? Linear::kEveryColumn : 0);
}

std::vector<Parameter*> LanguageModelHead::parameters() {
  return parameters_of({&norm_, &output_});
}

std::string LanguageModelHead::describe() const {
  return fmt::format("LanguageModelHead({})", output_.describe());
}

double gpt_model_bytes(const GptConfig& config) {
  return 2.0 * 4.0 * static_cast<double>(gpt_parameter_count(config));  // values and gradients
}

namespace {

/// `config` once it is a valid GPT whose parameters fit in memory; thrown otherwise, before any
/// member allocates.
const GptConfig& checked_gpt_config(const GptConfig& config) {
  if (config.layers <= 0 || config.heads <= 0 || config.dim <= 0 || config.context <= 0 ||
      config.vocabulary <= 0 || config.dim % config.heads != 0) {
    throw InvalidArgument(fmt::format("invalid GPT config {} (vocabulary {})",
                                      gpt_config_text(config), config.vocabulary));
  }
  require_memory(gpt_model_bytes(config),
                 fmt::format("the GPT {} ({} parameters)", gpt_config_text(config),
                             gpt_parameter_count(config)));
  return config;
}

}  // namespace

Gpt::Gpt(const GptConfig& config)
    : config_(checked_gpt_config(config)),
      embedding_(config.vocabulary, config.context, config.dim, mix64(config.seed ^ 0x656d62ULL),
                 config.init_std),
      head_(config, mix64(config.seed ^ 0x68656164ULL),
            config.tie ? &embedding_.token().weight() : nullptr) {
  prefix_parameter_names(embedding_, "embed");
  for (std::int64_t i = 0; i < config.layers; ++i) {
    auto block = std::make_unique<TransformerBlock>(
        config, mix64(config.seed ^ mix64(static_cast<std::uint64_t>(i) + 1)));
    prefix_parameter_names(*block, fmt::format("blocks.{}", i));
    blocks_.push_back(std::move(block));
  }
  prefix_parameter_names(head_, "head");
}

Tensor Gpt::forward(const Tensor& tokens) {
  Tensor x = run_forward(embedding_, tokens);
  for (auto& block : blocks_)
    x = run_forward(*block, x);
  return run_forward(head_, x);
}

Tensor Gpt::backward(const Tensor& grad_output, GradientSink& sink, bool) {
  Tensor grad = run_backward(head_, grad_output, sink, true);
  for (std::size_t i = blocks_.size(); i-- > 0;)
    grad = run_backward(*blocks_[i], grad, sink, true);
  run_backward(embedding_, grad, sink, false);
  return {};
}

std::vector<KeyValueCache> Gpt::make_caches(std::int64_t slots) {
  std::vector<std::int64_t> heads;
  for (auto& block : blocks_)
    heads.push_back(block->attention().local_heads());
  return make_layer_caches(slots, heads, config_.dim / config_.heads, config_.context);
}

Tensor Gpt::decode(const Tensor& tokens, const DecodeRows& rows,
                   std::vector<KeyValueCache>& caches) {
  check_decode_rows(tokens, rows, caches, blocks_.size());
  // Back to whole sequences however this call ends.
  struct Restore {
    Gpt& gpt;
    ~Restore() {
      gpt.embedding_.set_decode(nullptr);
      for (auto& block : gpt.blocks_)
        block->attention().set_decode(nullptr, nullptr);
    }
  } restore{*this};
  embedding_.set_decode(&rows);
  for (std::size_t i = 0; i < blocks_.size(); ++i)
    blocks_[i]->attention().set_decode(&rows, &caches[i]);
  const Tensor logits = forward(tokens.reshape(Shape{1, rows.size()}));
  return logits.reshape(Shape{rows.size(), logits.shape()[2]});
}

std::vector<Module*> Gpt::units() {
  std::vector<Module*> all{&embedding_};
  for (auto& block : blocks_)
    all.push_back(block.get());
  all.push_back(&head_);
  return all;
}

std::vector<std::vector<Module*>> Gpt::parameter_groups() {
  if (!config_.tie) return Decoder::parameter_groups();
  // The tied table is read by the embedding and the head: one group holds both.
  std::vector<std::vector<Module*>> groups{{&embedding_, &head_}};
  for (auto& block : blocks_)
    groups.push_back({block.get()});
  return groups;
}

std::vector<std::pair<std::string, Module*>> Gpt::children() {
  std::vector<std::pair<std::string, Module*>> all{{"embed", &embedding_}};
  for (std::size_t i = 0; i < blocks_.size(); ++i)
    all.emplace_back(fmt::format("blocks.{}", i), blocks_[i].get());
  all.emplace_back("head", &head_);
  return all;
}

void Gpt::set_sequence_split(SequenceSplit* split) {
  for (auto& block : blocks_)
    block->attention().set_sequence_split(split);
  embedding_.set_sequence_split(split);
}

void Gpt::set_exact_sums(bool on) {
  for (auto& block : blocks_)
    block->set_exact_blocks(on);
  head_.set_exact_blocks(on);
  exact_sums_ = on;
}

DecoderConfig Gpt::decoder_config() const {
  return config_;
}

std::string Gpt::config_text() const {
  return gpt_config_text(config_);
}

std::string Gpt::describe() const {
  return fmt::format("Gpt({}, vocabulary={})", gpt_config_text(config_), config_.vocabulary);
}

}  // namespace meshtensor::nn
