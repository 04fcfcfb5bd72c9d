#include <algorithm>
#include <unicode/normalizer2.h>
#include <unicode/unistr.h>

#include <fmt/format.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/core/untrusted_json.hpp>
#include <meshtensor/tokenize/normalizer.hpp>

#include "pipeline_part.hpp"

namespace meshtensor::tokenize {

namespace {

using Json = nlohmann::json;

/// `text` in a Unicode normalization form by ICU. ASCII is the same in every form.
std::string normalize_form(std::string_view text,
                           const icu::Normalizer2* (*instance)(UErrorCode&)) {
  if (std::all_of(text.begin(), text.end(), [](char c) { return (c & 0x80) == 0; }))
    return std::string(text);
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* form = instance(status);
  const icu::UnicodeString normalized =
      form->normalize(icu::UnicodeString::fromUTF8(
                          icu::StringPiece(text.data(), static_cast<int32_t>(text.size()))),
                      status);
  if (U_FAILURE(status))
    throw DataError(fmt::format("Unicode normalization failed: {}", u_errorName(status)));
  std::string out;
  normalized.toUTF8String(out);
  return out;
}

/// The Unicode normalization forms: their names in tokenizer.json and ICU's instances.
struct Form {
  const char* name;
  const icu::Normalizer2* (*instance)(UErrorCode&);
};
constexpr Form kForms[] = {{"NFC", &icu::Normalizer2::getNFCInstance},
                           {"NFD", &icu::Normalizer2::getNFDInstance},
                           {"NFKC", &icu::Normalizer2::getNFKCInstance},
                           {"NFKD", &icu::Normalizer2::getNFKDInstance}};

}  // namespace

Normalizer Normalizer::from_json(const Json& spec, const std::string& source) {
  Normalizer normalizer;
  if (!spec.is_null()) {
    for_each_part(spec, source, "normalizer", "normalizers",
                  [&](const Json& part, const std::string& type) { normalizer.add(part, type); });
  }
  return normalizer;
}

void Normalizer::add(const Json& spec, const std::string& type) {
  const auto text_field = [&](const char* key) {
    if (!spec.contains(key) || !spec[key].is_string())
      throw DataError(fmt::format("\"{}\" is not a string", key));
    return spec[key].get<std::string>();
  };
  if (const auto* form = std::ranges::find(kForms, type, &Form::name); form != std::end(kForms)) {
    steps_.push_back({Kind::form, type, {}});
  } else if (type == "Prepend") {
    steps_.push_back({Kind::prepend, text_field("prepend"), {}});
  } else if (type == "Replace") {
    steps_.push_back({Kind::replace, replace_pattern(spec), text_field("content")});
  } else {
    throw DataError(
        fmt::format("type '{}' is not one meshtensor computes (NFC, NFD, NFKC, NFKD, "
                    "Prepend, Replace, Sequence)",
                    type));
  }
}

std::string Normalizer::apply(std::string_view text) const {
  std::string out(text);
  for (const Step& step : steps_) {
    switch (step.kind) {
      case Kind::form:
        out = normalize_form(out, std::ranges::find(kForms, step.text, &Form::name)->instance);
        break;
      case Kind::prepend:
        if (!out.empty()) out.insert(0, step.text);
        break;
      case Kind::replace:
        out = replace_all(out, step.text, step.replacement);
        break;
    }
  }
  return out;
}

Json Normalizer::to_json() const {
  if (steps_.empty()) return nullptr;
  Json parts = Json::array();
  for (const Step& step : steps_) {
    switch (step.kind) {
      case Kind::form:
        parts.push_back({{"type", step.text}});
        break;
      case Kind::prepend:
        parts.push_back({{"type", "Prepend"}, {"prepend", step.text}});
        break;
      case Kind::replace:
        parts.push_back({{"type", "Replace"},
                         {"pattern", {{"String", step.text}}},
                         {"content", step.replacement}});
        break;
    }
  }
  if (parts.size() == 1) return parts[0];
  return {{"type", "Sequence"}, {"normalizers", parts}};
}

}  // namespace meshtensor::tokenize
