#pragma once

// Reading one config.json: each key with its class's default when absent or null, a value of
// the wrong type or range, or a setting meshtensor does not compute, refused naming the file
// and the key.

#include <cmath>
#include <cstdint>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <meshtensor/core/error.hpp>
#include <meshtensor/core/untrusted_json.hpp>

namespace meshtensor::hf {

/// Reads the keys of one config.json, each with its class's default when absent or null.
class ConfigReader {
 public:
  ConfigReader(const nlohmann::json& config, const std::string& file)
      : config_(config), file_(file) {}
  DataError bad(const std::string& key, const std::string& why) const {
    return DataError(fmt::format("{}: \"{}\" {}", file_, key, why));
  }
  bool has(const std::string& key) const {
    return config_.contains(key) && !config_[key].is_null();
  }
  const nlohmann::json& at(const std::string& key) const { return config_[key]; }
  std::int64_t integer(const std::string& key, std::int64_t fallback, std::int64_t low,
                       std::int64_t high) const {
    const std::int64_t value = has(key) ? checked_integer(key, at(key), low, high) : fallback;
    if (value < low || value > high) {
      throw bad(key, fmt::format("is absent: {}'s default {} is outside [{}, {}]", class_name_,
                                 fallback, low, high));
    }
    return value;
  }
  /// A key with another name transformers maps onto it (GPT2Config's hidden_size is n_embd):
  /// the one given, or both when they agree.
  std::int64_t integer(const std::string& key, const std::string& alias, std::int64_t fallback,
                       std::int64_t low, std::int64_t high) const {
    if (has(key) && has(alias) && at(key) != at(alias)) {
      throw bad(key, fmt::format("is {} but \"{}\" is {}: they name the same setting",
                                 json_excerpt(at(key)), alias, json_excerpt(at(alias))));
    }
    return integer(has(alias) && !has(key) ? alias : key, fallback, low, high);
  }
  double number(const std::string& key, double fallback) const {
    if (!has(key)) return fallback;
    if (!at(key).is_number() || !std::isfinite(at(key).get<double>()))
      throw bad(key, fmt::format("is {}, not a finite number", json_excerpt(at(key))));
    return at(key).get<double>();
  }
  bool flag(const std::string& key, bool fallback) const {
    if (!has(key)) return fallback;
    if (!at(key).is_boolean())
      throw bad(key, fmt::format("is {}, not true or false", json_excerpt(at(key))));
    return at(key).get<bool>();
  }
  std::string text(const std::string& key, const std::string& fallback) const {
    if (!has(key)) return fallback;
    if (!at(key).is_string())
      throw bad(key, fmt::format("is {}, not a string", json_excerpt(at(key))));
    return at(key).get<std::string>();
  }
  /// Refuses a setting meshtensor does not compute.
  void require(const std::string& key, bool holds, const std::string& why) const {
    if (!holds) throw bad(key, why);
  }
  void set_class(std::string name) { class_name_ = std::move(name); }
  const std::string& file() const { return file_; }

 private:
  std::int64_t checked_integer(const std::string& key, const nlohmann::json& value,
                               std::int64_t low, std::int64_t high) const {
    if (!value.is_number_integer() || value.get<std::int64_t>() < low ||
        value.get<std::int64_t>() > high) {
      throw bad(key,
                fmt::format("is {}, not an integer in [{}, {}]", json_excerpt(value), low, high));
    }
    return value.get<std::int64_t>();
  }

  const nlohmann::json& config_;
  const std::string& file_;
  std::string class_name_;
};

}  // namespace meshtensor::hf
