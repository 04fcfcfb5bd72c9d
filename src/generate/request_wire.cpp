#include <bit>

#include <fmt/format.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/generate/request_wire.hpp>

namespace meshtensor::generate {

nlohmann::json request_to_json(const Request& r) {
  return {{"prompt", r.prompt},
          {"max_new_tokens", r.max_new_tokens},
          {"temperature_bits", std::bit_cast<std::uint64_t>(r.sampling.temperature)},
          {"top_k", r.sampling.top_k},
          {"seed", r.sampling.seed},
          {"top_p_bits", std::bit_cast<std::uint64_t>(r.sampling.top_p)},
          {"score_prompt", r.score_prompt},
          {"top_logprobs", r.top_logprobs},
          {"stop_tokens", r.stop_tokens}};
}

Request request_from_json(const nlohmann::json& json) {
  try {
    Request r;
    r.prompt = json.at("prompt").get<std::vector<std::int64_t>>();
    r.max_new_tokens = json.at("max_new_tokens").get<std::int64_t>();
    r.sampling.temperature =
        std::bit_cast<double>(json.at("temperature_bits").get<std::uint64_t>());
    r.sampling.top_k = json.at("top_k").get<std::int64_t>();
    r.sampling.seed = json.at("seed").get<std::uint64_t>();
    r.sampling.top_p = std::bit_cast<double>(json.at("top_p_bits").get<std::uint64_t>());
    r.score_prompt = json.at("score_prompt").get<bool>();
    r.top_logprobs = json.at("top_logprobs").get<std::int64_t>();
    r.stop_tokens = json.at("stop_tokens").get<std::vector<std::int64_t>>();
    return r;
  } catch (const nlohmann::json::exception& error) {
    throw DataError(fmt::format("a request on the wire is malformed: {}", error.what()));
  }
}

}  // namespace meshtensor::generate
