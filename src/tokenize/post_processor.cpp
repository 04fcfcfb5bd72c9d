#include <algorithm>

#include <fmt/format.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/core/untrusted_json.hpp>
#include <meshtensor/tokenize/post_processor.hpp>

#include "pipeline_part.hpp"

namespace meshtensor::tokenize {

namespace {

using Json = nlohmann::json;

constexpr std::uint64_t kMaxId = std::uint64_t{1} << 24;

/// True for an integer in [0, kMaxId).
bool is_id(const Json& id) {
  return id.is_number_integer() && (id.is_number_unsigned() || id.get<std::int64_t>() >= 0) &&
         id.get<std::uint64_t>() < kMaxId;
}

/// The ids of a [token, id] pair of BertProcessing or RobertaProcessing.
std::int64_t pair_id(const Json& pair) {
  if (!pair.is_array() || pair.size() != 2 || !pair[0].is_string() || !is_id(pair[1]))
    throw DataError(fmt::format("{} is not a [token, id] pair", json_excerpt(pair)));
  return pair[1].get<std::int64_t>();
}

}  // namespace

PostProcessor PostProcessor::from_json(const Json& spec, const std::string& source) {
  PostProcessor post;
  if (spec.is_null()) return post;
  for_each_part(spec, source, "post_processor", "processors",
                [&](const Json& part, const std::string& type) { post.add(part, type); });
  if (!post.before_.empty() || !post.after_.empty()) post.spec_ = spec;
  return post;
}

PostProcessor PostProcessor::around(std::vector<std::int64_t> before,
                                    std::vector<std::int64_t> after,
                                    const std::vector<std::string>& before_names,
                                    const std::vector<std::string>& after_names) {
  PostProcessor post;
  post.before_ = std::move(before);
  post.after_ = std::move(after);
  if (post.before_.empty() && post.after_.empty()) return post;
  Json specials = Json::object();
  // One sequence between the specials, typed `type`: "single" is one, "pair" two.
  const auto sequence = [&](const char* name, int type) {
    Json pieces = Json::array();
    const auto special = [&](const std::string& entry, std::int64_t id) {
      pieces.push_back({{"SpecialToken", {{"id", entry}, {"type_id", type}}}});
      specials[entry] = {{"id", entry}, {"ids", {id}}, {"tokens", {entry}}};
    };
    for (std::size_t i = 0; i < post.before_.size(); ++i)
      special(before_names[i], post.before_[i]);
    pieces.push_back({{"Sequence", {{"id", name}, {"type_id", type}}}});
    for (std::size_t i = 0; i < post.after_.size(); ++i)
      special(after_names[i], post.after_[i]);
    return pieces;
  };
  const Json single = sequence("A", 0);
  Json pair = single;
  for (const Json& piece : sequence("B", 1))
    pair.push_back(piece);
  post.spec_ = {{"type", "TemplateProcessing"},
                {"single", single},
                {"pair", pair},
                {"special_tokens", specials}};
  return post;
}

void PostProcessor::add(const Json& spec, const std::string& type) {
  if (type == "ByteLevel") return;  // its offsets change; its ids do not
  if (!before_.empty() || !after_.empty()) throw DataError("a second part that adds tokens");
  if (type == "TemplateProcessing") {
    add_template(spec);
  } else if (type == "BertProcessing" || type == "RobertaProcessing") {
    if (!spec.contains("cls") || !spec.contains("sep")) throw DataError("it has no cls or sep");
    before_.push_back(pair_id(spec["cls"]));
    after_.push_back(pair_id(spec["sep"]));
  } else {
    throw DataError(
        fmt::format("type '{}' is not one meshtensor computes (TemplateProcessing, BertProcessing, "
                    "RobertaProcessing, ByteLevel, Sequence)",
                    type));
  }
}

void PostProcessor::add_template(const Json& spec) {
  const Json& single = spec.contains("single") ? spec["single"] : Json();
  const Json& specials = spec.contains("special_tokens") ? spec["special_tokens"] : Json::object();
  if (!single.is_array()) throw DataError("its \"single\" template is not a list");
  bool sequence = false;
  for (const Json& piece : single) {
    if (piece.is_object() && piece.contains("Sequence")) {
      if (piece["Sequence"].value("id", "") != "A")
        throw DataError(
            fmt::format("its single template holds {}, not sequence A", json_excerpt(piece)));
      if (sequence) throw DataError("its single template holds sequence A twice");
      sequence = true;
      continue;
    }
    if (!piece.is_object() || !piece.contains("SpecialToken") ||
        !piece["SpecialToken"].contains("id") || !piece["SpecialToken"]["id"].is_string())
      throw DataError(fmt::format("{} is not a SpecialToken or a Sequence", json_excerpt(piece)));
    const std::string name = piece["SpecialToken"]["id"].get<std::string>();
    if (!specials.is_object() || !specials.contains(name) || !specials[name].contains("ids") ||
        !specials[name]["ids"].is_array())
      throw DataError(fmt::format("special token '{}' has no ids in \"special_tokens\"", name));
    for (const Json& id : specials[name]["ids"]) {
      if (!is_id(id))
        throw DataError(fmt::format("special token '{}' has id {}", name, json_excerpt(id)));
      (sequence ? after_ : before_).push_back(id.get<std::int64_t>());
    }
  }
  if (!sequence) throw DataError("its single template has no sequence A");
}

std::span<const std::int64_t> PostProcessor::inner(std::span<const std::int64_t> ids) const {
  if (ids.size() >= before_.size() && std::ranges::equal(ids.first(before_.size()), before_))
    ids = ids.subspan(before_.size());
  if (ids.size() >= after_.size() && std::ranges::equal(ids.last(after_.size()), after_))
    ids = ids.first(ids.size() - after_.size());
  return ids;
}

Json PostProcessor::to_json(bool byte_level) const {
  if (!spec_.is_null()) return spec_;
  if (!byte_level) return nullptr;
  return {{"type", "ByteLevel"},
          {"add_prefix_space", true},
          {"trim_offsets", false},
          {"use_regex", true}};
}

}  // namespace meshtensor::tokenize
