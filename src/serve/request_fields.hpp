#pragma once

// The request fields the completions and chat endpoints share, each checked at the edge: an
// ApiError (400 unless said) names the field and the value at fault.

#include <cstdint>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include <meshtensor/serve/api.hpp>

namespace meshtensor::serve {

using nlohmann::json;

/// A 400 invalid_request_error about `param`.
ApiError bad(const std::string& param, const std::string& message);
/// A bounded excerpt of a value for messages.
std::string excerpt(const json& value);
/// The field `key`, or null when absent or null (optional fields take null as absent).
const json* field(const json& doc, const char* key);
/// `value` as an integer in [low, high].
std::int64_t integer_value(const json& value, const std::string& key, std::int64_t low,
                           std::int64_t high);
/// `value` as a number in [low, high].
double number_value(const json& value, const std::string& key, double low, double high);
/// `value` as a boolean.
bool bool_value(const json& value, const std::string& key);
/// The body as a JSON object whose fields are all `known` (a misspelt one is refused).
json parse_body(std::string_view body, const std::set<std::string>& known);
/// A "model" other than `model_name`: 404 model_not_found.
void check_model(const json& doc, const std::string& model_name);
/// "stop": a string or a list of them, within the limits.
std::vector<std::string> parse_stop(const json& doc, const ApiLimits& limits);
/// Fields taken only at their neutral values: the penalties, logit_bias; "user" is a string.
void check_neutral_fields(const json& doc);
/// temperature, top_p, top_k and seed into `params.sampling` (`default_seed` when none).
void parse_sampling(const json& doc, CompletionParams& params, std::uint64_t default_seed);

/// stream and stream_options.include_usage.
void parse_stream(const json& doc, CompletionParams& params);

}  // namespace meshtensor::serve
