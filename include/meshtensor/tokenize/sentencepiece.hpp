#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace meshtensor::tokenize {

/// A SentencePiece BPE model (a `tokenizer.model` protobuf), read and encoded by the
/// sentencepiece library itself, so its ids are those of `spm_encode` for every normalization
/// rule (nmt_nfkc, identity, ...), whitespace option and byte fallback.
class SentencePieceModel {
 public:
  /// The model in `serialized` (`source` names it in errors). DataError naming the problem: not
  /// a protobuf, a model the library refuses, a model type other than BPE.
  static std::shared_ptr<const SentencePieceModel> parse(std::string serialized,
                                                         const std::string& source);
  /// True when `bytes` start as a protobuf, not as JSON.
  static bool looks_like_model(std::string_view bytes);
  ~SentencePieceModel();
  /// Appends the ids of `text` (its bytes as given, as `spm_encode` reads them) to `out`.
  void encode(std::string_view text, std::vector<std::int64_t>& out) const;
  /// The number of pieces (ids 0 to size() - 1).
  std::size_t size() const { return pieces_.size(); }
  /// The text of piece `id`.
  const std::string& piece(std::size_t id) const { return pieces_[id].text; }
  /// The protobuf as read.
  const std::string& serialized() const { return serialized_; }
  /// The tokenizer.json Hugging Face's converter makes of the model: its pieces as a BPE
  /// vocabulary with merges by score, control, unknown and user-defined pieces as added tokens,
  /// byte fallback, the normalizer of its normalization rule, a decoder that undoes it.
  nlohmann::json hugging_face_json() const;

 private:
  SentencePieceModel();
  /// Reads the pieces and the options of serialized_; returns the trainer's model type.
  std::uint64_t read_protobuf(const std::string& source);
  /// The control, unknown and user-defined pieces as tokenizer.json added tokens.
  nlohmann::json added_tokens_json() const;
  /// The merges of the normal pieces, by score.
  nlohmann::json merges_json() const;
  struct Library;
  std::unique_ptr<Library> library_;
  std::string serialized_;
  struct Piece {
    std::string text;
    float score = 0;
    int type = 1;  // NORMAL 1, UNKNOWN 2, CONTROL 3, USER_DEFINED 4, UNUSED 5, BYTE 6
  };
  std::vector<Piece> pieces_;
  std::string normalization_;  // the rule's name: nmt_nfkc, identity, ...
  std::string charsmap_;       // its precompiled character map
  bool add_dummy_prefix_ = true;
  bool remove_extra_whitespaces_ = true;
  bool byte_fallback_ = false;
};

}  // namespace meshtensor::tokenize
