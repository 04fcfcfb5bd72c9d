#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace meshtensor::tokenize {

/// The decoder of a `tokenizer.json`: how a vocabulary entry becomes the bytes it stands for, and
/// what a decoded sequence loses at its start. Its parts: ByteLevel (GPT-2's byte symbols back
/// to bytes), Replace of a String, ByteFallback (`<0xNN>` to byte NN), Fuse, Strip and
/// Metaspace, alone or in a Sequence. Bytes are kept as they are: a byte-fallback byte that is
/// not part of valid UTF-8 stays that byte (Hugging Face writes U+FFFD for it).
class Decoder {
 public:
  /// No decoder: an entry stands for its own text.
  Decoder() = default;
  /// The decoder `spec` describes (null: none). DataError naming a part or a field meshtensor
  /// does not compute.
  static Decoder from_json(const nlohmann::json& spec, const std::string& source);
  /// GPT-2's ByteLevel decoder.
  static Decoder byte_level();
  /// The spec from_json() reads back (null when there are no parts).
  nlohmann::json to_json() const;
  /// True when entries are GPT-2's byte symbols.
  bool is_byte_level() const;
  /// The bytes of the vocabulary entry `entry`, where it continues a sequence.
  std::string entry_bytes(std::string_view entry) const;
  /// How many leading spaces a sequence decoded from its start loses (Strip's start; one for a
  /// Metaspace that prepends one), at most.
  int strip_start() const { return strip_start_; }
  /// How many trailing spaces it loses, at most (Strip's stop).
  int strip_stop() const { return strip_stop_; }
  /// `text`, a sequence's bytes from its start, without the spaces strip_start() and
  /// strip_stop() name.
  void strip(std::string& text) const;

 private:
  enum class Kind { byte_level, replace, byte_fallback, fuse, strip, metaspace };
  struct Step {
    Kind kind = Kind::fuse;
    std::string from;   ///< replace: the pattern; metaspace: the replacement; strip: the content
    std::string to;     ///< replace: its content
    int start = 0;      ///< strip: start; metaspace: 1 when it prepends
    int stop = 0;       ///< strip: stop
    bool split = true;  ///< metaspace
  };
  void add(const nlohmann::json& spec, const std::string& type);
  static nlohmann::json step_json(const Step& step);
  std::vector<Step> steps_;
  int strip_start_ = 0;
  int strip_stop_ = 0;
};

}  // namespace meshtensor::tokenize
