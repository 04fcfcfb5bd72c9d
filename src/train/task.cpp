#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <span>
#include <tuple>

#include <fmt/format.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/core/random.hpp>
#include <meshtensor/kernels/portable_math.hpp>
#include <meshtensor/nn/loss.hpp>
#include <meshtensor/tp/style.hpp>
#include <meshtensor/train/task.hpp>

namespace meshtensor::train {

void Task::check_tensor_parallel(std::int64_t degree) const {
  if (degree != 1) {
    throw InvalidArgument(
        fmt::format("the model '{}' has no tensor-parallel plan: a tp mesh dim of {} needs a "
                    "decoder (`model` gpt or llama)",
                    architecture(), degree));
  }
}

std::vector<std::pair<std::string, std::string>> Task::prepare_model(nn::Module&,
                                                                     tp::TensorParallel* tp,
                                                                     comm::ReductionMode) const {
  if (tp != nullptr) check_tensor_parallel(tp->size());
  return {};
}

std::string Task::sample(const std::function<Tensor(const Tensor&)>&, std::uint64_t) const {
  return {};
}

namespace {

/// epoch_order(), computed once for all the ranks of this process that ask for it while one
/// holds it: thread ranks would otherwise each keep a copy of the whole permutation.
std::shared_ptr<const std::vector<std::int64_t>> shared_epoch_order(std::int64_t count,
                                                                    std::uint64_t seed,
                                                                    std::int64_t epoch) {
  using Key = std::tuple<std::int64_t, std::uint64_t, std::int64_t>;
  static std::mutex mutex;
  static std::map<Key, std::weak_ptr<const std::vector<std::int64_t>>> orders;
  const std::lock_guard lock(mutex);
  std::erase_if(orders, [](const auto& entry) { return entry.second.expired(); });
  auto& slot = orders[Key{count, seed, epoch}];
  if (auto held = slot.lock()) return held;
  auto made = std::make_shared<const std::vector<std::int64_t>>(epoch_order(count, seed, epoch));
  slot = made;
  return made;
}

/// Images `order[first .. first + count)` of `set` (or first .. first + count - 1 without an
/// order) as f32 inputs in [0, 1] with their labels.
Batch gather_images(const ImageSet& set, const std::vector<std::int64_t>* order, std::int64_t first,
                    std::int64_t count) {
  const std::int64_t features = set.features();
  Batch batch{Tensor(Shape{count, features}, DType::f32), {}};
  auto values = batch.input.values<float>();
  batch.targets.resize(static_cast<std::size_t>(count));
  for (std::int64_t r = 0; r < count; ++r) {
    const std::int64_t sample =
        order != nullptr ? (*order)[static_cast<std::size_t>(first + r)] : first + r;
    const std::uint8_t* pixels = set.pixels.data() + sample * features;
    for (std::int64_t f = 0; f < features; ++f)
      values[static_cast<std::size_t>(r * features + f)] = static_cast<float>(pixels[f]) / 255.0f;
    batch.targets[static_cast<std::size_t>(r)] = set.labels[static_cast<std::size_t>(sample)];
  }
  return batch;
}

/// Windows of `text` starting at `starts`: inputs are `length` tokens, targets the next ones.
Batch gather_windows(const std::vector<std::int32_t>& text, const std::vector<std::int64_t>& starts,
                     std::int64_t length) {
  const auto count = static_cast<std::int64_t>(starts.size());
  Batch batch{Tensor(Shape{count, length}, DType::i64), {}};
  auto tokens = batch.input.values<std::int64_t>();
  batch.targets.resize(static_cast<std::size_t>(count * length));
  for (std::int64_t r = 0; r < count; ++r) {
    const std::int32_t* window = text.data() + starts[static_cast<std::size_t>(r)];
    for (std::int64_t t = 0; t < length; ++t) {
      const auto at = static_cast<std::size_t>(r * length + t);
      tokens[at] = window[t];
      batch.targets[at] = window[t + 1];
    }
  }
  return batch;
}

}  // namespace

ImageClassification::ImageClassification(const Dataset& data, nn::MlpConfig model)
    : data_(data), model_(std::move(model)) {
  model_.inputs = data.train.features();
  model_.outputs = kClasses;
}

std::string ImageClassification::architecture() const {
  return fmt::format("mlp hidden={} activation={} layernorm={}", fmt::join(model_.hidden, ","),
                     model_.activation == nn::Activation::gelu ? "gelu" : "relu",
                     model_.layernorm ? "yes" : "no");
}

std::unique_ptr<nn::Module> ImageClassification::make_model(std::uint64_t seed) const {
  nn::MlpConfig config = model_;
  config.seed = seed;
  return nn::make_mlp(config);
}

std::vector<std::vector<nn::Module*>> ImageClassification::parameter_groups(
    nn::Module& model) const {
  auto& sequential = dynamic_cast<nn::Sequential&>(model);
  std::vector<std::vector<nn::Module*>> groups;
  for (std::size_t i = 0; i < sequential.size(); ++i)
    if (!sequential.at(i).parameters().empty()) groups.push_back({&sequential.at(i)});
  return groups;
}

Batch ImageClassification::train_batch(std::uint64_t seed, std::int64_t epoch, std::int64_t first,
                                       std::int64_t count) const {
  const auto order = shared_epoch_order(data_.train.count, seed, epoch);
  return gather_images(data_.train, order.get(), first, count);
}

Batch ImageClassification::eval_batch(std::int64_t first, std::int64_t count) const {
  return gather_images(data_.test, nullptr, first, count);
}

ModelFootprint ImageClassification::footprint() const {
  std::vector<double> widths{static_cast<double>(model_.inputs)};
  for (const std::int64_t h : model_.hidden)
    widths.push_back(static_cast<double>(h));
  widths.push_back(static_cast<double>(model_.outputs));
  ModelFootprint footprint;
  for (std::size_t i = 0; i + 1 < widths.size(); ++i) {
    const double layer = widths[i] * widths[i + 1] + widths[i + 1] * (model_.layernorm ? 3 : 1);
    footprint.parameters += layer;
    footprint.next_largest_unit =
        std::max(footprint.next_largest_unit, std::min(footprint.largest_unit, layer));
    footprint.largest_unit = std::max(footprint.largest_unit, layer);
    footprint.activation_floats += 4.0 * widths[i + 1];
    footprint.training_flops_per_target += 6.0 * widths[i] * widths[i + 1];
  }
  footprint.input_floats = widths.front();
  footprint.activation_floats += 4.0 * widths.front();
  for (std::size_t i = 0; i + 1 < widths.size(); ++i) {
    footprint.exact_scratch_bytes =
        std::max(footprint.exact_scratch_bytes, 16.0 * widths[i] + 8.0 * widths[i + 1]);
  }
  return footprint;
}

namespace {

/// What a decoder of `model` holds, over sequences of its context.
ModelFootprint decoder_footprint(const nn::DecoderSpec& model) {
  const auto d = static_cast<double>(model.dim);
  const auto t = static_cast<double>(model.context);
  const auto v = static_cast<double>(model.vocabulary);
  const auto f = static_cast<double>(model.ffn);
  const auto head_dim = static_cast<double>(nn::decoder_head_dim(model));
  const auto kv = 2.0 * static_cast<double>(model.kv_heads) * head_dim;
  const double q = static_cast<double>(model.heads) * head_dim;
  const bool swiglu = model.mlp == nn::MlpKind::swiglu;
  const double mlp_in = (swiglu ? 2.0 : 1.0) * f;  // gate and up, or fc
  ModelFootprint footprint;
  footprint.parameters = static_cast<double>(nn::decoder_parameter_count(model));
  const auto block = static_cast<double>(nn::decoder_block_parameters(model));
  const double table = d * v + (model.positions == nn::PositionKind::learned ? t * d : 0.0);
  const double head = model.tie ? 0.0 : d * v + (model.head_bias ? v : 0.0);
  footprint.largest_unit = std::max({block, table + (model.tie ? 2.0 * d : 0.0), head + 2.0 * d});
  // The embedding and an untied head are both [vocabulary, dim]; a tied model's next is a block.
  footprint.next_largest_unit =
      model.tie ? std::min(block, table + 2.0 * d) : std::min(table, head);
  // Per token and layer, kept for backward: the normalised inputs, the queries (q wide), keys and
  // values and their rotated copies, one row of statistics per head, the attention output, the
  // MLP's hidden features (mlp_in) and its activation's output (ffn), the residual streams; plus
  // backward's temporaries of the layer in flight (one layer's worth again), then the logits,
  // their gradient and probabilities. Measured (Qwen3-0.6B's shape, 128 rows a rank): 2.5 MB a
  // row counted against 4.5 MB estimated; the default GPT's peaks stay below 24 dim a layer.
  const auto h = static_cast<double>(model.heads);
  const double kept = 6.0 * d + 2.0 * q + 2.0 * kv + mlp_in + f + 4.0 * h;
  footprint.activation_floats =
      t * ((static_cast<double>(model.layers) + 1.0) * kept + 3.0 * v + 4.0 * d);
  footprint.input_floats = 2.0 * t;
  footprint.exact_scratch_bytes =
      t * std::max({16.0 * mlp_in + 8.0 * d, 16.0 * f + 8.0 * d, 16.0 * d + 8.0 * v});
  // Keys and values (twice), the query side, an exact weight's rows (the MLP's first).
  footprint.sequence_gather_floats = t * (4.0 * kv + 3.0 * d + 3.0 * h + d + mlp_in);
  const auto layers = static_cast<double>(model.layers);
  const double matmuls = d * (2.0 * q + kv) + (swiglu ? 3.0 : 2.0) * d * f;
  footprint.training_flops_per_target = 6.0 * (layers * matmuls + d * v) + 6.0 * layers * q * t;
  return footprint;
}

}  // namespace

namespace {

std::vector<std::int32_t> token_ids(const tokenize::Tokenizer& tokenizer, std::string_view text) {
  const std::vector<std::int64_t> ids = tokenizer.encode(text);
  return {ids.begin(), ids.end()};
}

/// The bytes the targets of the first `windows` windows of `ids` (each `context` tokens, one
/// after the other) stand for, per target.
double bytes_per_target(const tokenize::Tokenizer& tokenizer, const std::vector<std::int32_t>& ids,
                        std::int64_t windows, std::int64_t context) {
  if (windows == 0) return 0;
  std::vector<std::int64_t> lengths(static_cast<std::size_t>(tokenizer.vocabulary()), -1);
  double bytes = 0;
  for (std::int64_t i = 1; i <= windows * context; ++i) {
    std::int64_t& length = lengths[static_cast<std::size_t>(ids[static_cast<std::size_t>(i)])];
    if (length < 0)
      length =
          static_cast<std::int64_t>(tokenizer.token_bytes(ids[static_cast<std::size_t>(i)]).size());
    bytes += static_cast<double>(length);
  }
  return bytes / static_cast<double>(windows * context);
}

}  // namespace

LanguageModelling::LanguageModelling(std::shared_ptr<const TextCorpus> corpus,
                                     nn::DecoderSpec model,
                                     std::shared_ptr<const tokenize::Tokenizer> tokenizer,
                                     std::int64_t window)
    : corpus_(std::move(corpus)),
      model_(std::move(model)),
      tokenizer_(tokenizer ? std::move(tokenizer) : tokenize::byte_tokenizer()),
      context_(window > 0 ? window : model_.context),
      vocabulary_(model_.vocabulary) {
  if (context_ > model_.context) {
    throw InvalidArgument(
        fmt::format("a window of {} tokens is longer than the model's context "
                    "of {}",
                    context_, model_.context));
  }
  if (vocabulary_ != tokenizer_->vocabulary()) {
    throw InvalidArgument(fmt::format("the tokenizer has {} tokens, the model's vocabulary {}",
                                      tokenizer_->vocabulary(), vocabulary_));
  }
  if (context_ < 1) {
    throw InvalidArgument(
        fmt::format("a context of {} tokens is not a window: give at least 1", context_));
  }
  train_ids_ = token_ids(*tokenizer_, corpus_->train);
  validation_ids_ = token_ids(*tokenizer_, corpus_->validation);
  const auto length = static_cast<std::int64_t>(train_ids_.size());
  if (length < context_ + 1) {
    throw InvalidArgument(fmt::format(
        "context={} needs windows of {} tokens, but the training text has only {} (give a "
        "smaller context or more text)",
        context_, context_ + 1, length));
  }
  eval_bytes_per_target_ = bytes_per_target(*tokenizer_, validation_ids_, eval_samples(), context_);
}

std::string LanguageModelling::architecture() const {
  return nn::decoder_architecture_text(model_, tokenizer_->name());
}

std::optional<double> bits_per_byte(double nats, const Task& task) {
  const double bytes = task.eval_bytes_per_target();
  if (bytes <= 0) return std::nullopt;
  return nats / std::log(2.0) / bytes;
}

std::map<std::string, std::string> LanguageModelling::checkpoint_metadata() const {
  if (tokenizer_->is_bytes()) return {};
  return {{"tokenizer", tokenizer_->to_json()}};
}

void LanguageModelling::check_tensor_parallel(std::int64_t degree) const {
  tp::check_decoder_degree(model_, degree);
}

std::vector<std::pair<std::string, std::string>> LanguageModelling::prepare_model(
    nn::Module& model, tp::TensorParallel* tp, comm::ReductionMode mode) const {
  auto& decoder = dynamic_cast<nn::Decoder&>(model);
  decoder.set_exact_sums(mode == comm::ReductionMode::exact);
  if (tp == nullptr || tp->size() == 1) return {};
  check_tensor_parallel(tp->size());
  return tp::parallelize_module(decoder, *tp, tp::decoder_plan(model_, tp->sequence_parallel()));
}

std::unique_ptr<nn::Module> LanguageModelling::make_model(std::uint64_t seed) const {
  return nn::make_decoder(nn::with_seed(model_, seed));
}

std::vector<std::vector<nn::Module*>> LanguageModelling::parameter_groups(nn::Module& model) const {
  return dynamic_cast<nn::Decoder&>(model).parameter_groups();
}

std::int64_t LanguageModelling::samples() const {
  return std::max<std::int64_t>(1, (train_tokens() - 1) / context_);
}

Batch LanguageModelling::train_batch(std::uint64_t seed, std::int64_t epoch, std::int64_t first,
                                     std::int64_t count) const {
  const std::int64_t last_start = train_tokens() - context_ - 1;
  const std::uint64_t stream =
      mix64(seed ^ mix64(0x77696e646f77ULL + static_cast<std::uint64_t>(epoch)));
  std::vector<std::int64_t> starts(static_cast<std::size_t>(count));
  for (std::int64_t r = 0; r < count; ++r)
    starts[static_cast<std::size_t>(r)] =
        uniform_int_sample(stream, static_cast<std::uint64_t>(first + r), 0, last_start);
  return gather_windows(train_ids_, starts, context_);
}

std::int64_t LanguageModelling::eval_samples() const {
  return std::min(kMaxEvalWindows, std::max<std::int64_t>(0, (validation_tokens() - 1) / context_));
}

Batch LanguageModelling::eval_batch(std::int64_t first, std::int64_t count) const {
  std::vector<std::int64_t> starts(static_cast<std::size_t>(count));
  for (std::int64_t r = 0; r < count; ++r)
    starts[static_cast<std::size_t>(r)] = (first + r) * context_;
  return gather_windows(validation_ids_, starts, context_);
}

ModelFootprint LanguageModelling::footprint() const {
  // A sample is a window: its activations and attention cost are the window's.
  const nn::DecoderSpec windowed = nn::with_context(model_, context_);
  ModelFootprint footprint = decoder_footprint(windowed);
  footprint.parameters = static_cast<double>(nn::decoder_parameter_count(model_));
  return footprint;
}

namespace {

/// The next token after `last` (f32 logits [1, vocabulary]) for continuation().
std::int64_t next_token(const Tensor& last, double temperature, std::uint64_t seed,
                        std::int64_t step) {
  if (temperature <= 0.0) return nn::predict(last).front();
  const std::span<const float> logits = last.values<float>();
  const float largest = *std::max_element(logits.begin(), logits.end());
  std::vector<double> weights(logits.size());
  double total = 0.0;
  for (std::size_t c = 0; c < logits.size(); ++c) {
    weights[c] = kernels::exp_f64((static_cast<double>(logits[c]) - largest) / temperature);
    total += weights[c];
  }
  // A uniform draw in [0, total) from 53 random bits of (seed, step).
  const std::uint64_t bits = mix64(seed ^ mix64(static_cast<std::uint64_t>(step) + 1)) >> 11;
  const double target = static_cast<double>(bits) * 0x1p-53 * total;
  double running = 0.0;
  for (std::size_t c = 0; c < weights.size(); ++c) {
    running += weights[c];
    if (target < running) return static_cast<std::int64_t>(c);
  }
  return static_cast<std::int64_t>(weights.size()) - 1;
}

}  // namespace

std::vector<std::int64_t> continuation(const std::function<Tensor(const Tensor&)>& forward,
                                       std::span<const std::int64_t> prompt, std::int64_t tokens,
                                       std::int64_t context, double temperature,
                                       std::uint64_t seed) {
  std::vector<std::int64_t> text(prompt.begin(), prompt.end());
  for (std::int64_t k = 0; k < tokens; ++k) {
    const auto length = std::min<std::int64_t>(context, static_cast<std::int64_t>(text.size()));
    Tensor input(Shape{1, length}, DType::i64);
    const auto offset = static_cast<std::ptrdiff_t>(text.size()) - length;
    std::copy(text.begin() + offset, text.end(), input.values<std::int64_t>().begin());
    const Tensor logits = forward(input);
    const std::int64_t vocabulary = logits.shape()[2];
    const Tensor last =
        logits.reshape(Shape{length, vocabulary}).narrow(0, length - 1, 1).contiguous();
    text.push_back(next_token(last, temperature, seed, k));
  }
  return {text.begin() + static_cast<std::ptrdiff_t>(prompt.size()), text.end()};
}

std::string LanguageModelling::sample(const std::function<Tensor(const Tensor&)>& forward,
                                      std::uint64_t seed) const {
  // The prompt: the start of the first validation record (of the training text when there is
  // no validation text), up to its first line.
  const std::string& source = corpus_->validation.empty() ? corpus_->train : corpus_->validation;
  std::string prompt = source.substr(0, std::min<std::size_t>(source.find('\n') + 1, 40));
  if (prompt.empty()) prompt = "\n";
  const std::vector<std::int64_t> ids = tokenizer_->encode(prompt);
  return prompt + tokenizer_->decode(continuation(forward, ids, kSampleTokens, context_,
                                                  kSampleTemperature, seed));
}

}  // namespace meshtensor::train
