#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include <meshtensor/core/dtype.hpp>
#include <meshtensor/core/shape.hpp>
#include <meshtensor/mesh/device_mesh.hpp>
#include <meshtensor/mesh/spec.hpp>
#include <meshtensor/plan/plan.hpp>

namespace meshtensor::cli {

/// A parsed redistribute request: what `plan` and `check` take.
using Transition = plan::Redistribution;

/// Human-readable table: the transition and every rank's block under both specs.
std::string describe_layouts(const Transition& transition);

/// The same as JSON.
nlohmann::json layouts_json(const Transition& transition);

}  // namespace meshtensor::cli
