#pragma once

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <meshtensor/tokenize/added_tokens.hpp>
#include <meshtensor/tokenize/decoder.hpp>
#include <meshtensor/tokenize/flat_tables.hpp>
#include <meshtensor/tokenize/normalizer.hpp>
#include <meshtensor/tokenize/post_processor.hpp>
#include <meshtensor/tokenize/pre_tokenizer.hpp>
#include <meshtensor/tokenize/sentencepiece.hpp>
#include <meshtensor/tokenize/tiktoken.hpp>

namespace meshtensor::tokenize {

/// The roles a model folder's tokenizer_config.json and generation_config.json give special
/// tokens: what starts, ends and pads a sequence. Empty: none.
struct SpecialRoles {
  std::string bos_token;              ///< the token a prompt may start with
  std::string eos_token;              ///< the tokenizer's end-of-sequence token
  std::string pad_token;              ///< the padding token
  std::vector<std::int64_t> end_ids;  ///< generation stops at any of them (eos first)
  bool operator==(const SpecialRoles&) const = default;
};

/// A BPE tokenizer as Hugging Face's `tokenizer.json` describes one, encoding as Hugging Face's
/// implementation does: added tokens are cut out of the text first; the rest is normalized,
/// split by the pre-tokenizer, and each piece merged by rank (the lowest-ranked adjacent pair
/// first, the leftmost of equal pairs). Byte-level files (GPT-2, Llama 3, Qwen) start a piece
/// from GPT-2's byte symbols; SentencePiece-style files (Llama 2, Mistral, TinyLlama) start it
/// from its characters, a character the vocabulary lacks becoming its bytes' `<0xNN>` tokens
/// (byte fallback) or the unknown token.
class Tokenizer {
 public:
  /// Pieces longer than this are merged in chunks of it, cut at character boundaries (the
  /// merges of a piece cost O(n log n) time and 20 bytes a byte; docs/tokenize.md).
  static constexpr std::size_t kMaxWordBytes = std::size_t{1} << 20;
  /// Parses the text of a `tokenizer.json` (`source` names it in errors). DataError naming the
  /// part: a model that is not BPE, a normalizer, pre-tokenizer, post-processor or decoder part
  /// meshtensor does not compute, a merge of tokens the vocabulary lacks (or whose result it
  /// lacks), ids repeated or negative, a byte symbol missing from a byte-level vocabulary, an
  /// unknown token the vocabulary lacks. A file of the 256 byte symbols in byte order with no
  /// merges, no added tokens and no split is the byte tokenizer (bytes()).
  static Tokenizer from_json(std::string_view text, const std::string& source);
  /// Reads and parses the `tokenizer.json` or SentencePiece `.model` file `path` (a regular
  /// file of at most 256 MiB). A tiktoken rank file is refused with the command that converts it
  /// (its pattern and special tokens are not in it).
  static Tokenizer load(const std::string& path);
  /// A SentencePiece BPE model (the bytes of a `.model` file): encoded by the sentencepiece
  /// library, so its ids are `spm_encode`'s; everything else as the tokenizer.json Hugging Face's
  /// converter makes of it. to_json() holds the model itself besides, under
  /// "sentencepiece_model" (base64), and reads back as this tokenizer.
  static Tokenizer from_sentencepiece(std::string model, const std::string& source);
  /// from_sentencepiece() of the `.model` file `path`.
  static Tokenizer load_sentencepiece(const std::string& path);
  /// GPT-2's own files as a tokenizer: `encoder` (the text of encoder.json: byte symbols -> id)
  /// and `merges` (the text of vocab.bpe: a "#version" line, then one "left right" merge a
  /// line, by rank), GPT-2's pre-tokenizer, and `<|endoftext|>` as the special token it names.
  static Tokenizer from_gpt2(std::string_view encoder, std::string_view merges,
                             const std::string& source);
  /// The tokenizer of a tiktoken rank file's text (tiktoken_document()): it encodes as tiktoken
  /// does, and its to_json() as Hugging Face's converter writes it besides.
  static Tokenizer from_tiktoken(std::string_view ranks, const TiktokenEncoding& encoding,
                                 const std::string& source);
  /// from_tiktoken() of the rank file `path`.
  static Tokenizer load_tiktoken(const std::string& path, const TiktokenEncoding& encoding);
  /// from_gpt2() of the files `encoder` (encoder.json) and `merges` (vocab.bpe).
  static Tokenizer load_gpt2(const std::string& encoder, const std::string& merges);
  /// The byte tokenizer: id b is byte b (256 tokens, no merges), and encode() keeps every byte
  /// as it is, valid UTF-8 or not.
  static Tokenizer bytes();
  /// A `tokenizer.json` Hugging Face's implementations read back as this tokenizer (for the
  /// byte tokenizer: a byte-level BPE without merges, which encodes UTF-8 text the same way).
  std::string to_json() const;
  /// to_json() as Hugging Face's readers take it: without "sentencepiece_model" (a tokenizer of
  /// a SentencePiece model is then the converter's tokenizer.json) nor "special_roles" and
  /// "chat_template" (an export writes those into tokenizer_config.json and
  /// generation_config.json).
  std::string to_hugging_face_json() const;
  /// The SentencePiece model this tokenizer encodes with (null for a tokenizer.json's).
  const std::shared_ptr<const SentencePieceModel>& sentencepiece() const { return sentencepiece_; }
  /// The name a model's architecture records: "bytes" for the byte tokenizer, otherwise "bpe:"
  /// and the 16 hex digits of the digest of to_json(), so two tokenizers with one name encode
  /// alike.
  std::string name() const;
  /// True for the byte tokenizer.
  bool is_bytes() const { return raw_bytes_; }
  /// The ids of `text` (invalid UTF-8 is first replaced by U+FFFD, as a JavaScript string
  /// decoded from the bytes would be), without the special tokens of the post-processor.
  std::vector<std::int64_t> encode(std::string_view text) const;
  /// The special tokens the post-processor puts around a text's ids (Llama's bos): what Hugging
  /// Face's encode() adds unless told not to.
  const PostProcessor& post_processor() const { return post_processor_; }
  /// encode() with the post-processor's tokens around the ids: a prompt as Hugging Face's
  /// encode() gives it (Llama's bos first).
  std::vector<std::int64_t> encode_with_specials(std::string_view text) const;
  /// The roles of its special tokens (empty for a tokenizer.json without them).
  const SpecialRoles& roles() const { return roles_; }
  /// Sets the roles. DataError naming `source` and a token it lacks or an id outside it.
  void set_roles(SpecialRoles roles, const std::string& source);
  /// The model's chat template (Jinja source, rendered by ChatTemplate), empty for none.
  const std::string& chat_template() const { return chat_template_; }
  /// Sets the chat template (kept as given: it is parsed when a chat is rendered).
  void set_chat_template(std::string source) { chat_template_ = std::move(source); }
  /// Puts `post_processor` around encoded texts instead (ids checked against the vocabulary).
  void set_post_processor(PostProcessor post_processor, const std::string& source);
  /// Marks the added token `id` special or not (what decode_text(.., true) skips).
  void set_special(std::int64_t id, bool special);
  /// Takes a batch of ids of an encode_each() call.
  using IdSink = std::function<void(std::span<const std::int64_t>)>;
  /// encode(), the ids handed to `take` in order, in batches, as they are made: memory beyond
  /// the text stays bounded however many ids it has.
  void encode_each(std::string_view text, const IdSink& take) const;
  /// The bytes of `ids` as a continuation of text: each token's token_bytes(), concatenated.
  /// InvalidArgument naming an id outside the vocabulary.
  std::string decode(std::span<const std::int64_t> ids) const;
  /// The text of `ids` from the start of a sequence, as Hugging Face's decode() gives it: without
  /// the special added tokens when `skip_special`, and without the leading space a
  /// SentencePiece-style decoder strips (the one encoding prepended).
  std::string decode_text(std::span<const std::int64_t> ids, bool skip_special) const;
  /// The bytes of one token where it continues a text (added tokens by their content; a
  /// byte-fallback token its byte; `▁` a space; an id no token has, as cl100k's between its
  /// special tokens: nothing, as Hugging Face and tiktoken decode it).
  std::string token_bytes(std::int64_t id) const;
  /// Ids from 0 to vocabulary() - 1.
  std::int64_t vocabulary() const { return static_cast<std::int64_t>(tokens_.size()); }
  /// Makes the vocabulary `size` ids, those past its own entries unused (decoding to nothing):
  /// a model's embedding padded past its tokenizer (Qwen's 151,936 rows for 151,665 tokens).
  /// Kept by to_json() as "padded_vocabulary". DataError naming `source` for a size below the
  /// tokenizer's own or above 2^24.
  void pad_vocabulary(std::int64_t size, const std::string& source);
  /// The added tokens.
  const std::vector<AddedToken>& added_tokens() const { return added_; }
  /// The id of a token given by its text (an added token's content, or a token's bytes).
  std::optional<std::int64_t> token_id(std::string_view text) const;

 private:
  Tokenizer() = default;
  /// The tokenizer of a parsed tokenizer.json; `parsed`, when given, is its sentencepiece_model
  /// already parsed.
  static Tokenizer from_document(const nlohmann::json& doc, const std::string& source,
                                 std::shared_ptr<const SentencePieceModel> parsed);
  /// The document to_json() writes.
  nlohmann::json document() const;
  /// Adds the merge of the tokens `left` and `right` at the next rank (a repeated pair keeps its
  /// first rank; with tiktoken_merges_, the rank of the first merge making the same token, kept
  /// in `first_making`); DataError naming it when the vocabulary lacks either or their
  /// concatenation.
  void add_merge(const std::string& left, const std::string& right, const std::string& source,
                 std::unordered_map<std::int64_t, std::int64_t>& first_making);
  /// The matchers of added_.
  void build_matchers();
  /// The bytes of `ids` (InvalidArgument naming one outside the vocabulary), without the special
  /// ones when `skip_special`.
  std::string decode_text_raw(std::span<const std::int64_t> ids, bool skip_special) const;
  /// InvalidArgument naming `id` unless it is inside the vocabulary.
  void check_id(std::int64_t id) const;
  /// Each id's bytes (token_bytes()) into piece_bytes_, for decoding by copies.
  void build_piece_bytes();
  /// token_bytes() of an id inside the vocabulary, without a copy.
  std::string_view piece_of(std::int64_t id) const {
    const auto at = static_cast<std::size_t>(id);
    return std::string_view(piece_bytes_)
        .substr(piece_offsets_[at], piece_offsets_[at + 1] - piece_offsets_[at]);
  }
  /// The 256 byte symbols in byte order and nothing else: the byte tokenizer's file.
  bool has_byte_layout() const;
  /// The ids of one pre-tokenized piece: Hugging Face's merge order (a heap of the adjacent
  /// pairs by rank, then position), in chunks of at most kMaxWordBytes.
  void encode_piece(std::string_view piece, std::vector<std::int64_t>& out) const;
  /// With ignore_merges, the id of a piece that is a whole token (true when it is one).
  bool encode_whole(std::string_view piece, std::vector<std::int64_t>& out) const;
  /// The ids of at most kMaxWordBytes of a piece, merged whole.
  void merge_word(std::string_view word, std::vector<std::int64_t>& out) const;
  /// The ids a word's merges start from: its bytes' symbols (byte-level), or its characters,
  /// with byte fallback and the unknown token.
  template <class Add>
  void initial_symbols(std::string_view word, const Add& add) const;
  /// Calls `take` with the words of a SentencePiece-style piece: it is cut between two
  /// characters of the vocabulary that no entry holds side by side, where no merge can cross,
  /// so the words merge as the whole piece would.
  template <class Take>
  void for_each_word(std::string_view piece, const Take& take) const;
  /// The id of the vocabulary entry that is the one character `c`, or -1.
  std::int64_t character_id(char32_t c) const;
  /// Reads the model's vocabulary, merges and options.
  void read_model(const nlohmann::json& model, const nlohmann::json& added_tokens,
                  const std::string& source);
  /// The ids of the byte symbols (byte-level) or of the `<0xNN>` tokens and the characters.
  void read_symbols(const std::string& source);
  /// Finds the unknown token's id; checks the post-processor's ids against the vocabulary.
  void check_references(const std::string& source);
  /// The ids of pieces seen before in one encode() call (short pieces only, a bounded number).
  class PieceCache;
  /// Ids on their way out: kept whole, or handed to a sink in batches.
  struct IdOutput {
    std::vector<std::int64_t> ids;
    const IdSink* sink = nullptr;
    /// After each piece: hands a large batch to the sink.
    void piece_done();
  };
  /// The ids of text without added tokens (pieces of `text` key `cache`: it must outlive it).
  void encode_ordinary(std::string_view text, bool at_start, IdOutput& out,
                       PieceCache& cache) const;
  /// The ids of a span of text between the added tokens that are matched before normalization.
  void encode_segment(std::string_view text, bool at_start, IdOutput& out, PieceCache& cache) const;
  /// encode_piece() of a long piece, each chunk's ids handed on before the next is merged.
  void encode_long_piece(std::string_view piece, IdOutput& out) const;
  /// encode() into `out`.
  void encode_into(std::string_view text, IdOutput& out) const;

  std::vector<std::string> tokens_;  // id -> byte symbols (UTF-8); an added token: its content
  std::vector<bool> is_added_;
  std::vector<bool> is_special_;                       // an added token marked special
  std::unordered_map<std::string, std::int64_t> ids_;  // byte symbols -> id
  PairTable merge_rank_;  // (left, right) -> rank (tiktoken_merges_: the first making the token)
  BytesTable whole_ids_;  // ignore_merges_: a piece's text (bytes, not symbols) -> its entry
  std::vector<std::pair<std::int64_t, std::int64_t>> merges_;  // by rank: (left, right)
  std::vector<std::int64_t> merged_;                           // by rank: the merged id
  std::vector<AddedToken> added_;
  AddedTokenMatcher raw_matcher_;         // the added tokens matched in the text as given
  AddedTokenMatcher normalized_matcher_;  // those matched in the normalized text
  Normalizer normalizer_;                 // of the text between the added tokens matched as given
  PreTokenizer pre_tokenizer_;
  PostProcessor post_processor_;
  Decoder decoder_;
  bool byte_level_ = true;  // pieces start from byte symbols, not characters
  bool ignore_merges_ = false;
  bool tiktoken_merges_ = false;
  bool byte_fallback_ = false;
  bool fuse_unk_ = false;
  std::string unk_token_;  // empty: none (unknown characters are dropped)
  std::int64_t unk_id_ = -1;
  SpecialRoles roles_;
  std::string chat_template_;
  std::int64_t padded_vocabulary_ = 0;        // 0: its own entries'
  std::string piece_bytes_;                   // every id's bytes, in id order
  std::vector<std::uint32_t> piece_offsets_;  // id -> its start in piece_bytes_ (and one past)
  bool raw_bytes_ = false;                    // the byte tokenizer
  std::shared_ptr<const SentencePieceModel> sentencepiece_;  // encodes, when set
  nlohmann::json sentencepiece_parts_;  // its normalizer and pre_tokenizer, as the file has them
  std::int64_t byte_ids_[256] = {};     // byte-level: each byte's symbol; else its <0xNN> or -1
  std::vector<std::int32_t> bmp_ids_;   // characters below U+10000 -> their entry's id or -1
  std::unordered_map<char32_t, std::int32_t> astral_ids_;  // and those above
  std::unordered_set<std::uint64_t> joined_;  // character pairs some entry holds side by side
};

/// Token ids given as text (`source` names it in errors): a JSON array, an object with "ids",
/// or decimal numbers between spaces. DataError or ParseError naming what is not an id (a
/// number past 2^63 - 1 is named as written, never wrapped).
std::vector<std::int64_t> parse_ids(const std::string& text, const std::string& source);

/// How write_ids() writes.
struct IdFormat {
  bool json = false;          ///< one JSON array, or decimal ids between spaces
  bool with_specials = true;  ///< the post-processor's special tokens around the text's ids
};

/// Writes the ids of `text` to `out` as they are made (the output is never held whole), then a
/// newline: the post-processor's special tokens (Llama's bos) first and last unless `format`
/// leaves them out, as Hugging Face's encode() adds them.
void write_ids(std::ostream& out, const Tokenizer& tokenizer, std::string_view text,
               const IdFormat& format);

/// One shared byte tokenizer (Tokenizer::bytes()), for whatever has no other.
const std::shared_ptr<const Tokenizer>& byte_tokenizer();

}  // namespace meshtensor::tokenize
