#pragma once

#include <nlohmann/json.hpp>

#include <meshtensor/generate/generator.hpp>

namespace meshtensor::generate {

/// `request` as JSON by field name, every field of Request and Sampling, doubles as their bits:
/// how one rank hands a request to the others (the server's rank 0 to its tensor-parallel
/// ranks), so that every rank generates from the same bits.
nlohmann::json request_to_json(const Request& request);

/// The Request request_to_json wrote; DataError naming a missing or mistyped field.
Request request_from_json(const nlohmann::json& json);

}  // namespace meshtensor::generate
