#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include <meshtensor/tokenize/split_pattern.hpp>

namespace meshtensor::tokenize {

/// The pre-tokenizer of a `tokenizer.json`, as Hugging Face applies it: a list of steps, each
/// splitting (and maybe rewriting) every piece the step before it made. Its parts: Digits, Split
/// by a Regex or a String (Isolated, Removed, MergedWithPrevious, MergedWithNext), ByteLevel
/// (with or without GPT-2's regex, add_prefix_space) and Metaspace (prepend_scheme always, first
/// or never; split or not), in a Sequence or alone.
class PreTokenizer {
 public:
  /// No pre-tokenizer: the text is one piece.
  PreTokenizer() = default;
  /// The pre-tokenizer `spec` describes (null: none). DataError naming a part or a field
  /// meshtensor does not compute, or a part after a ByteLevel (those work on its byte symbols).
  static PreTokenizer from_json(const nlohmann::json& spec, const std::string& source);
  /// ByteLevel without its regex and without a prefix space: the byte tokenizer's.
  static PreTokenizer plain_byte_level();
  /// The spec from_json() reads back (null when empty()).
  nlohmann::json to_json() const;
  /// True with no steps.
  bool empty() const { return steps_.empty(); }
  /// True when a ByteLevel step maps each piece's bytes to GPT-2's byte symbols: the model's
  /// symbols are bytes, not characters.
  bool byte_level() const;
  /// Takes a piece of for_each_piece().
  using PieceSink = std::function<void(std::string_view)>;
  /// Calls `take` with each piece of `text` (valid UTF-8) in order. `at_start`: the text begins
  /// the input (Metaspace's "first" prepends its replacement there only). A ByteLevel's pieces
  /// are given as bytes, before its byte map.
  void for_each_piece(std::string_view text, bool at_start, const PieceSink& take) const;

 private:
  enum class Kind { digits, split, byte_level, metaspace };
  /// How a Split treats its matches: Hugging Face's SplitDelimiterBehavior.
  enum class Behavior { isolated, removed, merged_with_previous, merged_with_next };
  /// Metaspace's prepend_scheme.
  enum class Prepend { never, first, always };
  struct Step {
    Kind kind = Kind::digits;
    bool flag =
        false;  ///< digits: each digit alone; byte_level: add_prefix_space; metaspace: split
    std::shared_ptr<const SplitPattern> pattern;  ///< split; byte_level with its regex
    std::string text;      ///< split: the Regex or String as written; metaspace: the replacement
    bool literal = false;  ///< split: by a String
    Behavior behavior = Behavior::isolated;
    Prepend prepend = Prepend::always;
  };
  void add(const nlohmann::json& spec, const std::string& type);
  void run(std::size_t step, std::string_view piece, bool at_start, const PieceSink& take) const;
  void run_split(const Step& step, std::size_t next, std::string_view piece, bool at_start,
                 const PieceSink& take) const;
  void run_metaspace(const Step& step, std::size_t next, std::string_view piece, bool at_start,
                     const PieceSink& take) const;
  static nlohmann::json step_json(const Step& step);
  std::vector<Step> steps_;
};

}  // namespace meshtensor::tokenize
