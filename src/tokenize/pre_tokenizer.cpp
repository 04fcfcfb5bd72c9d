#include <algorithm>

#include <fmt/format.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/core/untrusted_json.hpp>
#include <meshtensor/core/utf8.hpp>
#include <meshtensor/tokenize/added_tokens.hpp>
#include <meshtensor/tokenize/pre_tokenizer.hpp>

#include "pipeline_part.hpp"

namespace meshtensor::tokenize {

namespace {

using Json = nlohmann::json;

/// A part of a piece: a match of a Split's pattern (or a Metaspace's replacement) or a run of
/// text between matches.
struct Part {
  std::string_view text;
  bool match;
};

/// Calls `take` with the pieces of `text` that Hugging Face's Digits pre-tokenizer makes: runs
/// of numeric characters (Unicode N, as Rust's char::is_numeric), or each of them alone when
/// `each`, and the runs of other characters between them.
template <class Take>
void for_each_digit_piece(std::string_view text, bool each, const Take& take) {
  std::size_t start = 0;
  int kind = -1;  // of the run being built: 0 other, 1 numeric
  for (std::size_t at = 0; at < text.size();) {
    char32_t c = 0;
    const int length = std::max(1, utf8_sequence(text, at, c));
    const int now = is_unicode_numeric(c) ? 1 : 0;
    if (at > start && (now != kind || (now == 1 && each))) {
      take(text.substr(start, at - start));
      start = at;
    }
    kind = now;
    at += static_cast<std::size_t>(length);
  }
  if (start < text.size()) take(text.substr(start));
}

/// `text` as a PCRE2 pattern that matches it literally.
std::string literal_pattern(std::string_view text) {
  std::string out;
  for (const char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x80 && !std::isalnum(u)) out += '\\';
    out += c;
  }
  return out;
}

/// The parts of one piece, `parts` of it, cut as a Split with `merged_with` (-1 previous, 0
/// isolated or removed, 1 next) cuts: a match joins the run of text before (or after) it unless
/// that run is itself a match. Hugging Face's SplitDelimiterBehavior.
std::vector<Part> merge_parts(const std::vector<Part>& parts, int merged_with) {
  if (merged_with == 0) return parts;
  std::vector<Part> out;
  const auto join = [](std::string_view a, std::string_view b) {
    return std::string_view(a.data(), static_cast<std::size_t>(b.data() + b.size() - a.data()));
  };
  if (merged_with < 0) {
    bool previous_match = false;
    for (const Part& part : parts) {
      if (part.match && !previous_match && !out.empty()) {
        out.back().text = join(out.back().text, part.text);
      } else {
        out.push_back(part);
      }
      previous_match = part.match;
    }
    return out;
  }
  bool next_match = false;
  for (auto part = parts.rbegin(); part != parts.rend(); ++part) {
    if (part->match && !next_match && !out.empty()) {
      out.back().text = join(part->text, out.back().text);
    } else {
      out.push_back(*part);
    }
    next_match = part->match;
  }
  std::reverse(out.begin(), out.end());
  return out;
}

constexpr std::pair<const char*, int> kBehaviors[] = {
    {"Isolated", 0}, {"Removed", 0}, {"MergedWithPrevious", -1}, {"MergedWithNext", 1}};

}  // namespace

PreTokenizer PreTokenizer::from_json(const Json& spec, const std::string& source) {
  PreTokenizer pre;
  if (!spec.is_null()) {
    for_each_part(spec, source, "pre_tokenizer", "pretokenizers",
                  [&](const Json& part, const std::string& type) { pre.add(part, type); });
  }
  for (std::size_t i = 0; i + 1 < pre.steps_.size(); ++i) {
    if (pre.steps_[i].kind == Kind::byte_level) {
      throw DataError(
          fmt::format("{}: pre_tokenizer {}: a part after its ByteLevel would split byte symbols; "
                      "meshtensor computes a ByteLevel as the last part",
                      source, json_excerpt(spec)));
    }
  }
  const auto level = std::ranges::count(pre.steps_, Kind::byte_level, &Step::kind);
  const auto meta = std::ranges::count(pre.steps_, Kind::metaspace, &Step::kind);
  if (level > 0 && meta > 0) {
    throw DataError(fmt::format("{}: pre_tokenizer {}: both a ByteLevel and a Metaspace", source,
                                json_excerpt(spec)));
  }
  return pre;
}

PreTokenizer PreTokenizer::plain_byte_level() {
  PreTokenizer pre;
  Step step;
  step.kind = Kind::byte_level;
  pre.steps_.push_back(std::move(step));
  return pre;
}

void PreTokenizer::add(const Json& spec, const std::string& type) {
  const auto bad = [](const std::string& why) { return DataError(why); };
  try {
    Step step;
    if (type == "Digits") {
      step.kind = Kind::digits;
      step.flag = flag_field(spec, "individual_digits", false);
    } else if (type == "ByteLevel") {
      step.kind = Kind::byte_level;
      step.flag = flag_field(spec, "add_prefix_space", false);
      if (flag_field(spec, "use_regex", true))
        step.pattern = std::make_shared<const SplitPattern>(std::string(kGpt2Pattern));
    } else if (type == "Split") {
      step.kind = Kind::split;
      const Json pattern = spec.value("pattern", Json());
      const bool regex = pattern.is_object() && pattern.contains("Regex");
      step.literal = pattern.is_object() && pattern.contains("String");
      if (!(regex || step.literal) || pattern.size() != 1 || !pattern.begin()->is_string() ||
          pattern.begin()->get<std::string>().empty())
        throw bad("its pattern is not a non-empty Regex or String");
      step.text = pattern.begin()->get<std::string>();
      step.pattern = std::make_shared<const SplitPattern>(step.literal ? literal_pattern(step.text)
                                                                       : step.text);
      const std::string behavior = string_field(spec, "behavior", "");
      const auto* known =
          std::ranges::find(kBehaviors, behavior, &std::pair<const char*, int>::first);
      if (known == std::end(kBehaviors)) {
        throw bad(
            fmt::format("behavior '{}' is not one meshtensor computes (Isolated, Removed, "
                        "MergedWithPrevious, MergedWithNext)",
                        behavior));
      }
      step.behavior = static_cast<Behavior>(known - std::begin(kBehaviors));
      if (flag_field(spec, "invert", false)) throw bad("an inverted Split is not computed");
    } else if (type == "Metaspace") {
      step.kind = Kind::metaspace;
      step.text = character_field(spec, "replacement", "\u2581");
      step.flag = flag_field(spec, "split", true);
      const std::string scheme = prepend_scheme(spec);
      step.prepend = scheme == "always"  ? Prepend::always
                     : scheme == "first" ? Prepend::first
                                         : Prepend::never;
    } else {
      throw bad(fmt::format(
          "type '{}' is not one meshtensor computes (ByteLevel, Digits, Metaspace, Split, "
          "Sequence)",
          type));
    }
    steps_.push_back(std::move(step));
  } catch (const ParseError& e) {  // a pattern that does not compile
    throw bad(e.what());
  }
}

bool PreTokenizer::byte_level() const {
  return std::ranges::any_of(steps_, [](const Step& s) { return s.kind == Kind::byte_level; });
}

void PreTokenizer::for_each_piece(std::string_view text, bool at_start,
                                  const PieceSink& take) const {
  if (text.empty()) return;
  run(0, text, at_start, take);
}

void PreTokenizer::run(std::size_t index, std::string_view piece, bool at_start,
                       const PieceSink& take) const {
  if (piece.empty()) return;
  if (index == steps_.size()) {
    take(piece);
    return;
  }
  const Step& step = steps_[index];
  const std::size_t next = index + 1;
  switch (step.kind) {
    case Kind::digits:
      for_each_digit_piece(piece, step.flag, [&](std::string_view part) {
        run(next, part, at_start && part.data() == piece.data(), take);
      });
      return;
    case Kind::split:
      run_split(step, next, piece, at_start, take);
      return;
    case Kind::metaspace:
      run_metaspace(step, next, piece, at_start, take);
      return;
    case Kind::byte_level: {
      std::string spaced;
      if (step.flag && piece.front() != ' ') {
        spaced = " " + std::string(piece);
        piece = spaced;
      }
      if (!step.pattern) {
        run(next, piece, at_start, take);
        return;
      }
      step.pattern->for_each_piece(piece, [&](std::string_view part) {
        run(next, part, at_start && part.data() == piece.data(), take);
      });
      return;
    }
  }
}

void PreTokenizer::run_split(const Step& step, std::size_t next, std::string_view piece,
                             bool at_start, const PieceSink& take) const {
  std::vector<Part> parts;
  step.pattern->for_each_part(piece, [&](std::string_view text, bool match) {
    parts.push_back({text, match});
  });
  const int merged_with = kBehaviors[static_cast<int>(step.behavior)].second;
  for (const Part& part : merge_parts(parts, merged_with)) {
    if (step.behavior == Behavior::removed && part.match) continue;
    run(next, part.text, at_start && part.text.data() == piece.data(), take);
  }
}

void PreTokenizer::run_metaspace(const Step& step, std::size_t next, std::string_view piece,
                                 bool at_start, const PieceSink& take) const {
  std::string text;
  text.reserve(piece.size() + step.text.size());
  for (const char c : piece) {
    if (c == ' ') {
      text += step.text;
    } else {
      text += c;
    }
  }
  const bool prepend =
      step.prepend == Prepend::always || (step.prepend == Prepend::first && at_start);
  if (prepend && !text.starts_with(step.text)) text.insert(0, step.text);
  if (!step.flag) {
    run(next, text, at_start, take);
    return;
  }
  std::vector<Part> parts;
  const std::string_view whole = text;
  std::size_t gap = 0;
  for (std::size_t found; (found = whole.find(step.text, gap)) != std::string_view::npos;) {
    if (found > gap) parts.push_back({whole.substr(gap, found - gap), false});
    parts.push_back({whole.substr(found, step.text.size()), true});
    gap = found + step.text.size();
  }
  if (gap < whole.size()) parts.push_back({whole.substr(gap), false});
  for (const Part& part : merge_parts(parts, 1))
    run(next, part.text, at_start && part.text.data() == whole.data(), take);
}

Json PreTokenizer::step_json(const Step& step) {
  switch (step.kind) {
    case Kind::digits:
      return {{"type", "Digits"}, {"individual_digits", step.flag}};
    case Kind::byte_level:
      return {{"type", "ByteLevel"},
              {"add_prefix_space", step.flag},
              {"trim_offsets", true},
              {"use_regex", step.pattern != nullptr}};
    case Kind::split:
      return {{"type", "Split"},
              {"pattern", {{step.literal ? "String" : "Regex", step.text}}},
              {"behavior", kBehaviors[static_cast<int>(step.behavior)].first},
              {"invert", false}};
    case Kind::metaspace:
      break;
  }
  constexpr const char* kSchemes[] = {"never", "first", "always"};
  return {{"type", "Metaspace"},
          {"replacement", step.text},
          {"prepend_scheme", kSchemes[static_cast<int>(step.prepend)]},
          {"split", step.flag}};
}

Json PreTokenizer::to_json() const {
  if (steps_.empty()) return nullptr;
  if (steps_.size() == 1) return step_json(steps_[0]);
  Json parts = Json::array();
  for (const Step& step : steps_)
    parts.push_back(step_json(step));
  return {{"type", "Sequence"}, {"pretokenizers", parts}};
}

}  // namespace meshtensor::tokenize
