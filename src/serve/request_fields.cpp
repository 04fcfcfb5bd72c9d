#include "request_fields.hpp"

#include <cmath>

#include <fmt/format.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/core/untrusted_json.hpp>

namespace meshtensor::serve {

ApiError bad(const std::string& param, const std::string& message) {
  return {400, message, "invalid_request_error", param, ""};
}

std::string excerpt(const json& value) {
  return json_excerpt(value);
}

/// The field `key`, or null when absent or null (optional fields take null as absent).
const json* field(const json& doc, const char* key) {
  const auto found = doc.find(key);
  if (found == doc.end() || found->is_null()) return nullptr;
  return &*found;
}

std::int64_t integer_value(const json& value, const std::string& key, std::int64_t low,
                           std::int64_t high) {
  std::int64_t result = 0;
  if (value.is_number_integer() && !value.is_number_unsigned()) {
    result = value.get<std::int64_t>();
  } else if (value.is_number_unsigned() &&
             value.get<std::uint64_t>() <= static_cast<std::uint64_t>(high)) {
    result = static_cast<std::int64_t>(value.get<std::uint64_t>());
  } else if (value.is_number_unsigned()) {
    throw bad(key, fmt::format("'{}': {} is more than {}", key, excerpt(value), high));
  } else if (value.is_number_float() && std::isfinite(value.get<double>()) &&
             value.get<double>() == std::trunc(value.get<double>()) &&
             std::abs(value.get<double>()) < 0x1p62) {
    result = static_cast<std::int64_t>(value.get<double>());
  } else {
    throw bad(key, fmt::format("'{}' must be an integer, got {}", key, excerpt(value)));
  }
  if (result < low) throw bad(key, fmt::format("'{}': {} is less than {}", key, result, low));
  if (result > high) throw bad(key, fmt::format("'{}': {} is more than {}", key, result, high));
  return result;
}

double number_value(const json& value, const std::string& key, double low, double high) {
  if (!value.is_number()) {
    throw bad(key, fmt::format("'{}' must be a number, got {}", key, excerpt(value)));
  }
  const double result = value.get<double>();
  if (!(result >= low && result <= high)) {
    throw bad(key,
              fmt::format("'{}': {} is not between {} and {}", key, excerpt(value), low, high));
  }
  return result;
}

bool bool_value(const json& value, const std::string& key) {
  if (!value.is_boolean())
    throw bad(key, fmt::format("'{}' must be true or false, got {}", key, excerpt(value)));
  return value.get<bool>();
}

namespace {

/// Why `body` is not valid JSON, naming the top-level field the parser stopped in (a number
/// past the range of a double, such as 1e999, is one).
ApiError invalid_json(std::string_view body) {
  std::string key;
  const json::parser_callback_t last_key = [&](int depth, json::parse_event_t event, json& value) {
    if (depth == 1 && event == json::parse_event_t::key) key = value.get<std::string>();
    return true;
  };
  try {
    const json reparsed = json::parse(body, last_key);
    (void)reparsed;
  } catch (const json::out_of_range& e) {
    return bad(key, fmt::format("'{}' is not a number the server can read: {}", key, e.what()));
  } catch (const json::exception& e) {
    return bad("", fmt::format("the request body is not valid JSON: {}", e.what()));
  }
  return bad("", "the request body is not valid JSON");
}

}  // namespace

json parse_body(std::string_view body, const std::set<std::string>& known) {
  json doc;
  try {
    doc = parse_untrusted_json(body, "the request body");
  } catch (const Error& e) {
    throw bad("", e.what());
  }
  if (doc.is_discarded()) throw invalid_json(body);
  if (!doc.is_object()) {
    throw bad("", fmt::format("the request body must be a JSON object, got {}", excerpt(doc)));
  }
  for (const auto& [key, value] : doc.items()) {
    if (known.count(key) == 0) {
      throw bad(key, fmt::format("Unrecognized request argument supplied: '{}' (a misspelt field "
                                 "is refused rather than ignored)",
                                 key));
    }
  }
  return doc;
}

void check_model(const json& doc, const std::string& model_name) {
  const json* model = field(doc, "model");
  if (model == nullptr) return;
  if (!model->is_string())
    throw bad("model", fmt::format("'model' must be a string, got {}", excerpt(*model)));
  if (model->get<std::string>() != model_name) {
    throw ApiError{404,
                   fmt::format("The model '{}' does not exist: this server serves '{}'",
                               model->get<std::string>(), model_name),
                   "invalid_request_error", "model", "model_not_found"};
  }
}

std::vector<std::string> parse_stop(const json& doc, const ApiLimits& limits) {
  const json* value = field(doc, "stop");
  if (value == nullptr) return {};
  std::vector<std::string> stop;
  if (value->is_string()) {
    stop.push_back(value->get<std::string>());
  } else if (value->is_array()) {
    for (const json& item : *value) {
      if (!item.is_string())
        throw bad("stop", fmt::format("'stop' items must be strings, got {}", excerpt(item)));
      stop.push_back(item.get<std::string>());
    }
  } else {
    throw bad("stop",
              fmt::format("'stop' must be a string or a list of strings, got {}", excerpt(*value)));
  }
  if (static_cast<std::int64_t>(stop.size()) > limits.max_stop) {
    throw bad("stop", fmt::format("'stop' has {} sequences; at most {} are allowed", stop.size(),
                                  limits.max_stop));
  }
  for (const std::string& s : stop) {
    if (s.empty()) throw bad("stop", "'stop' sequences must not be empty");
    if (static_cast<std::int64_t>(s.size()) > limits.max_stop_bytes) {
      throw bad("stop", fmt::format("a 'stop' sequence of {} bytes is longer than the {} allowed",
                                    s.size(), limits.max_stop_bytes));
    }
  }
  return stop;
}

/// OpenAI fields the server takes only at their neutral values.
void check_neutral_fields(const json& doc) {
  for (const char* key : {"presence_penalty", "frequency_penalty"}) {
    if (const json* value = field(doc, key); value && number_value(*value, key, -2, 2) != 0)
      throw bad(key, fmt::format("'{}' is not supported: only 0, got {}", key, excerpt(*value)));
  }
  if (const json* value = field(doc, "logit_bias");
      value && !(value->is_object() && value->empty())) {
    throw bad("logit_bias", "'logit_bias' is not supported");
  }
  if (const json* value = field(doc, "user"); value && !value->is_string())
    throw bad("user", fmt::format("'user' must be a string, got {}", excerpt(*value)));
}

void parse_sampling(const json& doc, CompletionParams& params, std::uint64_t default_seed) {
  params.sampling.temperature = 1.0;
  if (const json* v = field(doc, "temperature"))
    params.sampling.temperature = number_value(*v, "temperature", 0, 2);
  if (const json* v = field(doc, "top_p")) params.sampling.top_p = number_value(*v, "top_p", 0, 1);
  if (const json* v = field(doc, "top_k")) {
    params.sampling.top_k = std::max<std::int64_t>(0, integer_value(*v, "top_k", -1, 1 << 30));
  }
  params.sampling.seed = default_seed;
  if (const json* v = field(doc, "seed")) {
    params.seed_given = true;
    if (v->is_number_unsigned()) {
      params.sampling.seed = v->get<std::uint64_t>();
    } else {
      params.sampling.seed = static_cast<std::uint64_t>(
          integer_value(*v, "seed", std::numeric_limits<std::int64_t>::min(),
                        std::numeric_limits<std::int64_t>::max()));
    }
  }
}

void parse_stream(const json& doc, CompletionParams& params) {
  if (const json* v = field(doc, "stream")) params.stream = bool_value(*v, "stream");
  if (const json* v = field(doc, "stream_options")) {
    if (!v->is_object()) {
      throw bad("stream_options",
                fmt::format("'stream_options' must be an object, got {}", excerpt(*v)));
    }
    for (const auto& [key, value] : v->items()) {
      if (key != "include_usage")
        throw bad("stream_options", fmt::format("unknown 'stream_options' field '{}'", key));
      params.include_usage = bool_value(value, "stream_options.include_usage");
    }
  }
}

}  // namespace meshtensor::serve
