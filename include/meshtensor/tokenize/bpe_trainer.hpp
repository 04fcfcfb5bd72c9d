#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <meshtensor/tokenize/tokenizer.hpp>

namespace meshtensor::tokenize {

/// What `train_bpe` learns.
struct BpeTrainerConfig {
  /// Tokens in all: the 256 bytes, the merges and the special tokens.
  std::int64_t vocabulary = 8192;
  /// The pre-tokenizer's split: "gpt2" (GPT-2's ByteLevel regex) or "llama3" (Llama 3's Split).
  std::string pattern = "gpt2";
  /// Added tokens, special, given the last ids in this order (GPT-2 puts `<|endoftext|>` last).
  std::vector<std::string> special_tokens{"<|endoftext|>"};
};

/// What a training run did.
struct BpeTrainerReport {
  std::int64_t pieces = 0;           ///< pre-tokenized pieces of the text
  std::int64_t distinct_pieces = 0;  ///< of them different
  std::int64_t merges = 0;           ///< merges learned
  bool exhausted = false;            ///< stopped before the vocabulary: no pair occurs twice
  double seconds = 0;                ///< the training took
};

/// InvalidArgument naming what is wrong in `config`: a vocabulary outside [256 + specials,
/// 2^24], a special token that is empty, given twice or not valid UTF-8.
void check_trainer_config(const BpeTrainerConfig& config);

/// The pattern text of a `BpeTrainerConfig::pattern` name; InvalidArgument naming another.
std::string_view pattern_of(const std::string& name);

/// Learns byte-level BPE merges from `text`, deterministically. Ids 0-255 are the bytes, each
/// merge takes the next id, the special tokens the last ones. The text is cut at the special
/// tokens' occurrences and split by the pattern; merges never cross a piece. Each step merges
/// the adjacent pair that occurs most often in the text (counted over the pieces, every
/// occurrence of a piece counting), ties going to the smallest (left id, right id); every
/// occurrence is merged left to right, as encoding does. Training stops at the vocabulary or
/// when no pair occurs twice. InvalidArgument naming a vocabulary smaller than 256 plus the
/// special tokens, an empty or repeated special token, or an unknown pattern name.
Tokenizer train_bpe(std::string_view text, const BpeTrainerConfig& config,
                    BpeTrainerReport* report = nullptr);

}  // namespace meshtensor::tokenize
