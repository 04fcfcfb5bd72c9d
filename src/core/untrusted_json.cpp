#include <fmt/format.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/core/memory.hpp>
#include <meshtensor/core/untrusted_json.hpp>

namespace meshtensor {

namespace {

/// The deepest nesting of `text`, counting brackets outside strings; stops early past `limit`.
int nesting_depth(std::string_view text, int limit) {
  int depth = 0;
  int deepest = 0;
  bool in_string = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
      if (deepest > limit) return deepest;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return deepest;
}

// What the parsed document may take per byte of text, at most (numbers and small objects).
constexpr double kParsedBytesPerTextByte = 24.0;

}  // namespace

nlohmann::json parse_untrusted_json(std::string_view text, const std::string& file,
                                    const nlohmann::json::parser_callback_t& callback) {
  if (nesting_depth(text, kMaxJsonDepth) > kMaxJsonDepth) {
    throw DataError(fmt::format("{}: its JSON nests deeper than {} levels (damaged or not ours)",
                                file, kMaxJsonDepth));
  }
  require_memory(static_cast<double>(text.size()) * kParsedBytesPerTextByte,
                 fmt::format("parsing the {} bytes of JSON in {}", text.size(), file));
  return nlohmann::json::parse(text.begin(), text.end(), callback, /*allow_exceptions=*/false);
}

std::string json_excerpt(const nlohmann::json& value) {
  constexpr std::size_t kLength = 40;
  if (value.is_array()) return fmt::format("a list of {} item(s)", value.size());
  if (value.is_object()) return fmt::format("an object of {} key(s)", value.size());
  if (value.is_string()) {
    const auto& text = value.get_ref<const std::string&>();
    if (text.size() > kLength)
      return nlohmann::json(text.substr(0, kLength))
                 .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) +
             "...";
  }
  return value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace meshtensor
