#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include <meshtensor/tokenize/tokenizer.hpp>
#include <meshtensor/train/text_data.hpp>

namespace meshtensor::rl {

/// Scores a completion of a prompt (both as bytes). Must return a finite number.
using RewardFunction =
    std::function<double(const std::string& prompt, const std::string& completion)>;

/// Where Debian's word list (package wamerican) lives.
inline constexpr const char* kDefaultDictionary = "/usr/share/dict/words";

/// Largest word list read (Debian's lists are about 1 MiB).
inline constexpr std::int64_t kMaxDictionaryBytes = std::int64_t{64} << 20;

/// A set of English words, compared in lower case.
class Dictionary {
 public:
  /// The words of `path`, one per line. DataError naming the path (and the package that
  /// provides the default one) when it is missing, unreadable, not a regular file (a FIFO, a
  /// device), larger than kMaxDictionaryBytes, or holds no word.
  static std::shared_ptr<const Dictionary> load(const std::string& path);
  /// Whether `word` (any case) is in the list.
  bool contains(std::string_view word) const;
  /// Number of words.
  std::size_t size() const { return words_.size(); }

 private:
  std::unordered_set<std::string> words_;
};

/// The words of `text`: maximal runs of ASCII letters, with apostrophes between letters kept
/// inside a word ("don't"); everything else (punctuation, digits, spaces, other bytes) separates.
std::vector<std::string_view> split_words(std::string_view text);

/// The distinct English words of `text` over its words: a word is English when it is in
/// `dictionary` (any case; single letters only as "a" and "I"); a word repeated counts once (in
/// any case), so that no word said over and over scores; and the words counted are at least one
/// per 6 bytes of `text` (English text's average, its space included), so that a word or two
/// among blanks does not score fully. 0 for a text with no word.
double english_word_fraction(const Dictionary& dictionary, std::string_view text);

/// What an RL run practises: a pool of prompts, a reward, and text to build the model's task
/// from (a byte-level GPT over it).
struct RlTask {
  std::string name;
  std::vector<std::string> prompts;  ///< as text
  RewardFunction reward;
  std::shared_ptr<const train::TextCorpus> corpus;
  /// The model's tokenizer: it encodes the prompts and decodes completions (set by tokenized()).
  std::shared_ptr<const tokenize::Tokenizer> tokenizer = tokenize::byte_tokenizer();
  /// The prompts' tokens, all of one length (set by tokenized()).
  std::vector<std::vector<std::int64_t>> prompt_tokens;
};

/// `task` for a model reading tokens of `tokenizer` (null: bytes): its prompts encoded. GRPO
/// compares the samples of a step position by position, so every prompt must have the same
/// number of tokens: the pool keeps the prompts of the most common length (the shorter of two
/// equally common ones), in their order. Every prompt stays with the byte tokenizer when the
/// prompts have one length in bytes.
RlTask tokenized(RlTask task, std::shared_ptr<const tokenize::Tokenizer> tokenizer);

/// `task` tokenized() for the model of the checkpoint `init` (its tokenizer; the index is read
/// by this process); `task` itself when `init` is empty. DataError naming a checkpoint whose
/// architecture or tokenizer does not check.
RlTask tokenized_for(RlTask task, const std::string& init);

/// The built-in tasks come tokenized() for the byte tokenizer.
///
/// "words": prompts are the first `prompt_bytes` bytes of the validation (held-out) records of
/// `corpus` (records shorter than that are left out); the reward is english_word_fraction of
/// the completion. InvalidArgument when no record is long enough.
RlTask words_task(std::shared_ptr<const train::TextCorpus> corpus,
                  std::shared_ptr<const Dictionary> dictionary, std::int64_t prompt_bytes);

/// "arithmetic": prompts "A+B=" for every A and B from 10 to 49 (6 bytes). The reward is 0 for
/// a completion that does not start with a digit; otherwise 0.25, plus 0.5 times the fraction of
/// the sum's digits it starts with (in place), plus 0.25 when all of them are followed by a
/// non-digit or the end: 1 for the exact sum. A byte model of English text starts near zero and
/// learns the form first, then the digits. The corpus holds every "A+B=C" line (for the
/// model's task only).
RlTask arithmetic_task();

/// "words" or "arithmetic" with what they need; InvalidArgument naming any other name.
RlTask builtin_task(const std::string& name, const std::string& data_path,
                    const std::string& dictionary_path, std::int64_t prompt_bytes);

}  // namespace meshtensor::rl
