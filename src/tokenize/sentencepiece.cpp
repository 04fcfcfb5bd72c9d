#include <algorithm>
#include <cstring>
#include <sentencepiece_processor.h>
#include <tuple>
#include <unordered_map>

#include <fmt/format.h>

#include <meshtensor/core/base64.hpp>
#include <meshtensor/core/error.hpp>
#include <meshtensor/core/utf8.hpp>
#include <meshtensor/tokenize/sentencepiece.hpp>

namespace meshtensor::tokenize {

struct SentencePieceModel::Library {
  sentencepiece::SentencePieceProcessor processor;
};

namespace {

using Json = nlohmann::json;

/// Reads protobuf's wire format: fields of a message, each a number, a wire type and a value.
/// DataError (naming `what`) on anything that runs past the end or is no wire type.
class WireReader {
 public:
  WireReader(std::string_view data, std::string what) : data_(data), what_(std::move(what)) {}
  bool done() const { return at_ >= data_.size(); }
  /// The next field's number and wire type.
  std::pair<std::uint64_t, int> key() {
    const std::uint64_t key = varint();
    const auto type = static_cast<int>(key & 7);
    if (key >> 3 == 0 || (type != 0 && type != 1 && type != 2 && type != 5))
      throw bad(fmt::format("field key {} at byte {}", key, at_));
    return {key >> 3, type};
  }
  std::uint64_t varint() {
    std::uint64_t value = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (done()) throw bad("a number runs past the end");
      const auto byte = static_cast<unsigned char>(data_[at_++]);
      value |= static_cast<std::uint64_t>(byte & 0x7F) << shift;
      if ((byte & 0x80) == 0) return value;
    }
    throw bad("a number of more than 10 bytes");
  }
  std::string_view bytes() {
    const std::uint64_t length = varint();
    if (length > data_.size() - at_)
      throw bad(fmt::format("a field of {} bytes runs past the end", length));
    const std::string_view out = data_.substr(at_, length);
    at_ += length;
    return out;
  }
  float fixed32_float() {
    if (data_.size() - at_ < 4) throw bad("a float runs past the end");
    std::uint32_t bits = 0;
    for (int i = 3; i >= 0; --i)
      bits = (bits << 8) | static_cast<unsigned char>(data_[at_ + static_cast<std::size_t>(i)]);
    at_ += 4;
    float value = 0;
    std::memcpy(&value, &bits, 4);
    return value;
  }
  /// Calls `take(number, wire type)` with each field left; a field it does not read (it returns
  /// false) is skipped.
  template <class Take>
  void fields(const Take& take) {
    while (!done()) {
      const auto [number, wire] = key();
      if (!take(number, wire)) skip(wire);
    }
  }
  void skip(int type) {
    if (type == 0) {
      varint();
    } else if (type == 2) {
      bytes();
    } else {
      const std::size_t width = type == 1 ? 8 : 4;
      if (data_.size() - at_ < width) throw bad("a fixed field runs past the end");
      at_ += width;
    }
  }

 private:
  DataError bad(const std::string& why) const {
    return DataError(fmt::format("{} is not a SentencePiece model protobuf: {}", what_, why));
  }
  std::string_view data_;
  std::string what_;
  std::size_t at_ = 0;
};

constexpr int kNormal = 1;
constexpr int kUnknown = 2;
constexpr int kControl = 3;
constexpr int kUserDefined = 4;
constexpr std::uint64_t kBpe = 2;

const char* model_type_name(std::uint64_t type) {
  switch (type) {
    case 1:
      return "unigram";
    case 3:
      return "word";
    case 4:
      return "char";
    default:
      return "unknown";
  }
}

}  // namespace

SentencePieceModel::SentencePieceModel() : library_(std::make_unique<Library>()) {}
SentencePieceModel::~SentencePieceModel() = default;

bool SentencePieceModel::looks_like_model(std::string_view bytes) {
  const auto first = bytes.find_first_not_of(" \t\r\n");
  return first != std::string_view::npos && bytes[first] != '{' && bytes[first] != '[';
}

std::uint64_t SentencePieceModel::read_protobuf(const std::string& source) {
  std::uint64_t model_type = 1;  // the protobuf's default: unigram
  WireReader reader(serialized_, source);
  reader.fields([&](std::uint64_t field, int wire) {
    if (wire != 2) return false;
    WireReader inner(reader.bytes(), source);  // a length-delimited field is read, or passed
    if (field == 1) pieces_.emplace_back();
    inner.fields([&](std::uint64_t number, int type) {
      if (field == 1 && number == 1 && type == 2) {
        pieces_.back().text = std::string(inner.bytes());
      } else if (field == 1 && number == 2 && type == 5) {
        pieces_.back().score = inner.fixed32_float();
      } else if (field == 1 && number == 3 && type == 0) {
        pieces_.back().type = static_cast<int>(inner.varint());
      } else if (field == 2 && number == 3 && type == 0) {
        model_type = inner.varint();
      } else if (field == 2 && number == 35 && type == 0) {
        byte_fallback_ = inner.varint() != 0;
      } else if (field == 3 && number == 1 && type == 2) {
        normalization_ = std::string(inner.bytes());
      } else if (field == 3 && number == 2 && type == 2) {
        charsmap_ = std::string(inner.bytes());
      } else if (field == 3 && number == 3 && type == 0) {
        add_dummy_prefix_ = inner.varint() != 0;
      } else if (field == 3 && number == 4 && type == 0) {
        remove_extra_whitespaces_ = inner.varint() != 0;
      } else {
        return false;
      }
      return true;
    });
    return true;
  });
  return model_type;
}

std::shared_ptr<const SentencePieceModel> SentencePieceModel::parse(std::string serialized,
                                                                    const std::string& source) {
  std::shared_ptr<SentencePieceModel> model(new SentencePieceModel());
  model->serialized_ = std::move(serialized);
  const std::uint64_t model_type = model->read_protobuf(source);
  if (model->pieces_.empty()) {
    throw DataError(fmt::format("{} is not a SentencePiece model: it has no pieces", source));
  }
  if (model_type != kBpe) {
    throw DataError(fmt::format(
        "{}: a SentencePiece {} model; meshtensor reads BPE models (spm_train --model_type bpe)",
        source, model_type_name(model_type)));
  }
  const auto status = model->library_->processor.LoadFromSerializedProto(model->serialized_);
  if (!status.ok()) {
    throw DataError(fmt::format("{}: the sentencepiece library refuses the model: {}", source,
                                status.ToString()));
  }
  if (model->library_->processor.GetPieceSize() != static_cast<int>(model->pieces_.size())) {
    throw DataError(fmt::format("{}: the library reads {} pieces, the file holds {}", source,
                                model->library_->processor.GetPieceSize(), model->pieces_.size()));
  }
  return model;
}

void SentencePieceModel::encode(std::string_view text, std::vector<std::int64_t>& out) const {
  std::vector<int> ids;
  const auto status = library_->processor.Encode(text, &ids);
  if (!status.ok())
    throw InvalidArgument(fmt::format("SentencePiece encoding failed: {}", status.ToString()));
  out.insert(out.end(), ids.begin(), ids.end());
}

Json SentencePieceModel::added_tokens_json() const {
  Json added = Json::array();
  for (std::size_t id = 0; id < pieces_.size(); ++id) {
    const Piece& piece = pieces_[id];
    if (piece.type != kUnknown && piece.type != kControl && piece.type != kUserDefined) continue;
    added.push_back({{"id", id},
                     {"content", piece.text},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", piece.type != kUserDefined}});
  }
  return added;
}

Json SentencePieceModel::merges_json() const {
  std::unordered_map<std::string_view, std::size_t> id_of;
  for (std::size_t id = 0; id < pieces_.size(); ++id)
    id_of.emplace(pieces_[id].text, id);
  // A merge for each way a normal piece splits into two pieces; by the piece's score, highest
  // first, then by the parts' ids.
  std::vector<std::tuple<float, std::size_t, std::size_t, std::size_t>> merges;
  for (std::size_t id = 0; id < pieces_.size(); ++id) {
    if (pieces_[id].type != kNormal) continue;
    const std::string_view text = pieces_[id].text;
    for (std::size_t cut = 1; cut < text.size(); ++cut) {
      if ((static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) continue;
      const auto left = id_of.find(text.substr(0, cut));
      const auto right = id_of.find(text.substr(cut));
      if (left == id_of.end() || right == id_of.end()) continue;
      merges.emplace_back(-pieces_[id].score, id, left->second, right->second);
    }
  }
  std::stable_sort(merges.begin(), merges.end());
  Json list = Json::array();
  for (const auto& [score, id, left, right] : merges)
    list.push_back(Json::array({pieces_[left].text, pieces_[right].text}));
  return list;
}

Json SentencePieceModel::hugging_face_json() const {
  const std::string space = "\u2581";
  Json normalizer = Json::array();
  Json pre_tokenizer;
  if (normalization_ == "identity" && !remove_extra_whitespaces_) {
    if (add_dummy_prefix_) normalizer.push_back({{"type", "Prepend"}, {"prepend", space}});
    normalizer.push_back({{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", space}});
  } else {
    if (!charsmap_.empty())
      normalizer.push_back(
          {{"type", "Precompiled"}, {"precompiled_charsmap", base64_encode(charsmap_)}});
    normalizer.push_back({{"type", "Strip"}, {"strip_left", false}, {"strip_right", true}});
    normalizer.push_back(
        {{"type", "Replace"}, {"pattern", {{"Regex", " {2,}"}}}, {"content", space}});
    pre_tokenizer = {{"type", "Metaspace"},
                     {"replacement", space},
                     {"prepend_scheme", add_dummy_prefix_ ? "always" : "never"},
                     {"split", true}};
  }
  Json decoders =
      Json::array({{{"type", "Replace"}, {"pattern", {{"String", space}}}, {"content", " "}},
                   {{"type", "ByteFallback"}},
                   {{"type", "Fuse"}}});
  if (add_dummy_prefix_)
    decoders.push_back({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}});
  const auto unk = std::ranges::find(pieces_, kUnknown, &Piece::type);
  Json vocab = Json::object();
  for (std::size_t id = 0; id < pieces_.size(); ++id)
    vocab[pieces_[id].text] = id;
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens", added_tokens_json()},
          {"normalizer", {{"type", "Sequence"}, {"normalizers", normalizer}}},
          {"pre_tokenizer", pre_tokenizer},
          {"post_processor", nullptr},
          {"decoder", {{"type", "Sequence"}, {"decoders", decoders}}},
          {"model",
           {{"type", "BPE"},
            {"dropout", nullptr},
            {"unk_token", unk == pieces_.end() ? Json() : Json(unk->text)},
            {"continuing_subword_prefix", nullptr},
            {"end_of_word_suffix", nullptr},
            {"fuse_unk", true},
            {"byte_fallback", byte_fallback_},
            {"ignore_merges", false},
            {"vocab", vocab},
            {"merges", merges_json()}}}};
}

}  // namespace meshtensor::tokenize
