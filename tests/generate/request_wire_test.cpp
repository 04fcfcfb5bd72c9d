#include <cmath>
#include <cstring>

#include <gtest/gtest.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/generate/request_wire.hpp>

namespace meshtensor::generate {
namespace {

TEST(RequestWire, RoundTripsEveryFieldBitForBit) {
  Request sent;
  sent.prompt = {1, 255, 7};
  sent.max_new_tokens = 9;
  sent.sampling.temperature = 0.1 + 0.2;  // not a short decimal: the bits must travel
  sent.sampling.top_k = 5;
  sent.sampling.seed = 0xFFFFFFFFFFFFFFFFull;
  sent.sampling.top_p = std::nextafter(1.0, 0.0);
  sent.score_prompt = true;
  sent.top_logprobs = 3;
  sent.stop_tokens = {2, 128009};
  const Request got = request_from_json(nlohmann::json::parse(request_to_json(sent).dump()));
  EXPECT_EQ(got.prompt, sent.prompt);
  EXPECT_EQ(got.max_new_tokens, sent.max_new_tokens);
  EXPECT_EQ(std::memcmp(&got.sampling.temperature, &sent.sampling.temperature, sizeof(double)), 0);
  EXPECT_EQ(got.sampling.top_k, sent.sampling.top_k);
  EXPECT_EQ(got.sampling.seed, sent.sampling.seed);
  EXPECT_EQ(std::memcmp(&got.sampling.top_p, &sent.sampling.top_p, sizeof(double)), 0);
  EXPECT_EQ(got.score_prompt, sent.score_prompt);
  EXPECT_EQ(got.top_logprobs, sent.top_logprobs);
  EXPECT_EQ(got.stop_tokens, sent.stop_tokens);
  // Every field is carried by name: one entry per field of Request and Sampling.
  EXPECT_EQ(request_to_json(sent).size(), 9u);
}

TEST(RequestWire, AMalformedRequestIsADataError) {
  nlohmann::json json = request_to_json(Request{{1}, 2, {}, false, 0});
  json.erase("seed");
  EXPECT_THROW(request_from_json(json), DataError);
}

}  // namespace
}  // namespace meshtensor::generate
