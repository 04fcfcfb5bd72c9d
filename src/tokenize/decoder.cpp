#include <algorithm>

#include <fmt/format.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/core/untrusted_json.hpp>
#include <meshtensor/core/utf8.hpp>
#include <meshtensor/tokenize/byte_level.hpp>
#include <meshtensor/tokenize/decoder.hpp>

#include "pipeline_part.hpp"

namespace meshtensor::tokenize {

namespace {

using Json = nlohmann::json;

/// The byte a byte-fallback entry (`<0xNN>`, hex digits of either case) stands for, or -1.
int fallback_byte(std::string_view entry) {
  if (entry.size() != 6 || !entry.starts_with("<0x") || entry.back() != '>') return -1;
  int value = 0;
  for (const char c : entry.substr(3, 2)) {
    const int digit = c >= '0' && c <= '9'   ? c - '0'
                      : c >= 'a' && c <= 'f' ? c - 'a' + 10
                      : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                             : -1;
    if (digit < 0) return -1;
    value = value * 16 + digit;
  }
  return value;
}

/// `text` without up to `start` leading and `stop` trailing copies of the character `content`.
void strip_text(std::string& text, const std::string& content, int start, int stop) {
  if (content.empty()) return;
  std::size_t begin = 0;
  for (int i = 0; i < start && text.compare(begin, content.size(), content) == 0; ++i)
    begin += content.size();
  std::size_t end = text.size();
  for (int i = 0; i < stop && end >= begin + content.size() &&
                  text.compare(end - content.size(), content.size(), content) == 0;
       ++i)
    end -= content.size();
  text = text.substr(begin, end - begin);
}

int count_field(const Json& spec, const char* key) {
  if (!spec.contains(key) || spec[key].is_null()) return 0;
  if (!spec[key].is_number_integer() || spec[key].get<std::int64_t>() < 0 ||
      spec[key].get<std::uint64_t>() > 1024)
    throw DataError(
        fmt::format("\"{}\" is {}, not a count up to 1024", key, json_excerpt(spec[key])));
  return spec[key].get<int>();
}

}  // namespace

Decoder Decoder::from_json(const Json& spec, const std::string& source) {
  Decoder decoder;
  if (!spec.is_null()) {
    for_each_part(spec, source, "decoder", "decoders",
                  [&](const Json& part, const std::string& type) { decoder.add(part, type); });
  }
  return decoder;
}

Decoder Decoder::byte_level() {
  Decoder decoder;
  Step step;
  step.kind = Kind::byte_level;
  decoder.steps_.push_back(std::move(step));
  return decoder;
}

void Decoder::add(const Json& spec, const std::string& type) {
  Step step;
  if (type == "ByteLevel") {
    step.kind = Kind::byte_level;
  } else if (type == "Fuse") {
    step.kind = Kind::fuse;
  } else if (type == "ByteFallback") {
    step.kind = Kind::byte_fallback;
  } else if (type == "Replace") {
    step.kind = Kind::replace;
    step.from = replace_pattern(spec);
    step.to = string_field(spec, "content", "");
  } else if (type == "Strip") {
    // Steps before the first Fuse see one entry at a time: a Strip there strips each entry.
    if (std::ranges::none_of(steps_, [](const Step& s) {
          return s.kind == Kind::fuse || s.kind == Kind::byte_level;
        })) {
      throw DataError(
          "a Strip before any Fuse strips each token; meshtensor strips a decoded sequence "
          "(Fuse first)");
    }
    step.kind = Kind::strip;
    step.from = character_field(spec, "content", " ");
    if (step.from != " ") throw DataError("meshtensor strips spaces only (\"content\": \" \")");
    step.start = count_field(spec, "start");
    step.stop = count_field(spec, "stop");
  } else if (type == "Metaspace") {
    step.kind = Kind::metaspace;
    step.from = character_field(spec, "replacement", "\u2581");
    step.to = prepend_scheme(spec);
    step.start = step.to == "never" ? 0 : 1;
    step.split = flag_field(spec, "split", true);
  } else {
    throw DataError(fmt::format(
        "type '{}' is not one meshtensor computes (ByteLevel, ByteFallback, Fuse, Metaspace, "
        "Replace, Strip, Sequence)",
        type));
  }
  strip_start_ += step.start;
  strip_stop_ += step.stop;
  steps_.push_back(std::move(step));
}

bool Decoder::is_byte_level() const {
  return std::ranges::any_of(steps_, [](const Step& s) { return s.kind == Kind::byte_level; });
}

std::string Decoder::entry_bytes(std::string_view entry) const {
  std::string text(entry);
  bool is_byte = false;  // a byte-fallback byte passes the later steps unchanged
  for (const Step& step : steps_) {
    switch (step.kind) {
      case Kind::byte_level:
        if (std::optional<std::string> bytes = symbols_to_bytes(text)) text = std::move(*bytes);
        break;
      case Kind::replace:
        if (!is_byte) text = replace_all(text, step.from, step.to);
        break;
      case Kind::metaspace:
        if (!is_byte) text = replace_all(text, step.from, " ");
        break;
      case Kind::byte_fallback:
        if (const int byte = fallback_byte(text); byte >= 0 && !is_byte) {
          text.assign(1, static_cast<char>(byte));
          is_byte = true;
        }
        break;
      case Kind::fuse:
      case Kind::strip:
        break;
    }
  }
  return text;
}

void Decoder::strip(std::string& text) const {
  strip_text(text, " ", strip_start_, strip_stop_);
}

Json Decoder::step_json(const Step& step) {
  switch (step.kind) {
    case Kind::byte_level:
      return {{"type", "ByteLevel"},
              {"add_prefix_space", true},
              {"trim_offsets", true},
              {"use_regex", true}};
    case Kind::fuse:
      return {{"type", "Fuse"}};
    case Kind::byte_fallback:
      return {{"type", "ByteFallback"}};
    case Kind::replace:
      return {{"type", "Replace"}, {"pattern", {{"String", step.from}}}, {"content", step.to}};
    case Kind::strip:
      return {
          {"type", "Strip"}, {"content", step.from}, {"start", step.start}, {"stop", step.stop}};
    case Kind::metaspace:
      break;
  }
  return {{"type", "Metaspace"},
          {"replacement", step.from},
          {"prepend_scheme", step.to},
          {"split", step.split}};
}

Json Decoder::to_json() const {
  if (steps_.empty()) return nullptr;
  if (steps_.size() == 1) return step_json(steps_[0]);
  Json parts = Json::array();
  for (const Step& step : steps_)
    parts.push_back(step_json(step));
  return {{"type", "Sequence"}, {"decoders", parts}};
}

}  // namespace meshtensor::tokenize
