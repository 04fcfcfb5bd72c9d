#include <meshtensor/generate/generator.hpp>
#include <meshtensor/generate/load.hpp>

#include "bindings.hpp"

namespace meshtensor::python {

namespace {

/// The request of a prompt: a str (UTF-8) or bytes encoded by the model's tokenizer with its
/// special tokens (a bos), or a sequence of its ids as given; it ends at the tokenizer's end ids.
generate::Request prompt_request(const py::handle& prompt, const tokenize::Tokenizer& tokenizer,
                                 std::int64_t max_new_tokens, const generate::Sampling& sampling) {
  if (py::isinstance<py::str>(prompt) || py::isinstance<py::bytes>(prompt)) {
    const std::string bytes = py::isinstance<py::str>(prompt)
                                  ? prompt.cast<std::string>()
                                  : std::string(prompt.cast<py::bytes>());
    return generate::text_request(tokenizer, bytes, max_new_tokens, sampling);
  }
  generate::Request request{{}, max_new_tokens, sampling};
  request.stop_tokens = tokenizer.roles().end_ids;
  for (const auto& token : prompt.cast<py::sequence>())
    request.prompt.push_back(cast_argument<std::int64_t>(token, "generate() prompt token"));
  return request;
}

py::list run_generate(const std::string& checkpoint, const py::object& prompts,
                      std::int64_t max_new_tokens, double temperature, std::int64_t top_k,
                      std::uint64_t seed, const std::string& mode, std::int64_t max_batch,
                      std::int64_t prefill_chunk, const py::object& world_object) {
  const bool single = py::isinstance<py::str>(prompts) || py::isinstance<py::bytes>(prompts);
  const std::shared_ptr<const tokenize::Tokenizer> tokenizer =
      generate::model_tokenizer(checkpoint);
  std::vector<generate::Request> requests;
  const generate::Sampling sampling{temperature, top_k, seed};
  if (single) {
    requests.push_back(prompt_request(prompts, *tokenizer, max_new_tokens, sampling));
  } else {
    for (const auto& p : prompts.cast<py::sequence>())
      requests.push_back(prompt_request(p, *tokenizer, max_new_tokens, sampling));
  }
  const comm::ReductionMode reduction = mode_from(mode);
  if (reduction == comm::ReductionMode::native) {
    throw InvalidArgument(
        "generate(): mode='native': generation runs in 'ordered' or 'exact' mode (the trainer's "
        "bits need one of them)");
  }
  generate::GeneratorOptions options;
  options.max_batch = max_batch;
  options.prefill_chunk = prefill_chunk;
  options.exact_logprobs = reduction == comm::ReductionMode::exact;
  std::shared_ptr<comm::Communicator> world = world_or_current(world_object);
  std::vector<generate::Completion> completions;
  {
    const py::gil_scoped_release release;
    const std::unique_ptr<nn::Decoder> model = generate::load_decoder(*world, checkpoint);
    model->set_exact_sums(reduction == comm::ReductionMode::exact);
    generate::Generator generator(*model, options);
    generator.check_between_steps([&world] { world->throw_if_aborted(); });  // Ctrl-C stops it
    completions = generator.generate(requests);
  }
  py::list out;
  for (std::size_t i = 0; i < completions.size(); ++i) {
    const generate::Completion& c = completions[i];
    const auto shown = generate::text_tokens(c, requests[i]);
    py::dict d;
    d["tokens"] = c.tokens;
    d["logprobs"] = c.logprobs;
    d["text"] = py::bytes(tokenizer->decode(shown));
    d["finish_reason"] = shown.size() < c.tokens.size() ? "stop" : "length";
    out.append(d);
  }
  return out;
}

}  // namespace

void bind_generate(py::module_& module) {
  module.def("generate", &run_generate, py::arg("checkpoint"), py::arg("prompts"), py::kw_only(),
             py::arg("max_new_tokens") = 64, py::arg("temperature") = 0.8, py::arg("top_k") = 0,
             py::arg("seed") = 0, py::arg("mode") = "ordered", py::arg("max_batch") = 16,
             py::arg("prefill_chunk") = 64, py::arg("world") = py::none(),
             "Continues `prompts` (a str or bytes, or a list of them or of token-id lists) with "
             "the decoder of a checkpoint saved by any training layout, as `meshtensor generate` "
             "does, text encoded by the checkpoint's tokenizer: one dict per prompt with tokens, "
             "logprobs (the bits the trainer's forward gives each token) and text (the bytes of "
             "the tokens). A prompt's result does not depend on the others, max_batch or "
             "prefill_chunk.");
}

}  // namespace meshtensor::python
